#!/usr/bin/env python3
"""How well the layout search's composed model (planning/search/compose.py) agrees with the
dry run's full simulation: a sample spread over one job's composed ranking, each layout also
predicted in full.

    python scripts/composed_vs_full.py 8 llama3_8b.toml --profile h100_grand_teton --sample 16 \\
        [--json out.json] [overrides...]

Prints per sampled layout the composed and full tokens/s per device and peak, then the
fraction of pairs the two order differently, their Spearman rank correlation, and the
composed step-time and peak error (median and range).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def spearman(a: list[float], b: list[float]) -> float:
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        for k, i in enumerate(order):
            r[i] = float(k)
        return r

    ra, rb = ranks(a), ranks(b)
    n = len(a)
    ma, mb = sum(ra) / n, sum(rb) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = sum((x - ma) ** 2 for x in ra) ** 0.5
    vb = sum((y - mb) ** 2 for y in rb) ** 0.5
    return cov / (va * vb) if va and vb else 0.0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("ngpu", type=int)
    ap.add_argument("config")
    ap.add_argument("--profile", default="h100_grand_teton")
    ap.add_argument("--sample", type=int, default=16)
    ap.add_argument("--json", default="")
    args, overrides = ap.parse_known_args(argv)

    from torchtitan.checks import load_config
    from torchtitan.checks.job import accepts
    from torchtitan.distributed.job_shape import degrees
    from torchtitan.hardware import PROFILES
    from torchtitan.planning.memory.budget import CUDA_MARGIN
    from torchtitan.planning.search import search as layout_search
    from torchtitan.planning.search import space as layout_space
    from torchtitan.training.planned_job import PlannedJob, model_on_meta
    from torchtitan.units import GIB

    cfg, _ = load_config(
        [
            f"--job.config_file={os.path.join(ROOT, 'train_configs', args.config)}",
            "--job.dry_run=true",
            f"--hardware.profile={args.profile}",
            *overrides,
        ],
        args.ngpu,
    )
    hw = PROFILES[args.profile]
    budget = int(hw.memory_gib * GIB * (1 - CUDA_MARGIN))
    job = PlannedJob(cfg, model_on_meta(cfg), degrees(cfg, args.ngpu), "cuda")
    t0 = time.perf_counter()
    cands, info = layout_search.score(job, hw, budget)
    print(
        f"scored {len(cands):,} layouts in {time.perf_counter() - t0:.1f}s"
        f" (probe {info['probe']:.1f}s, compose {info['compose']:.1f}s)",
        flush=True,
    )
    ok = accepts(args.ngpu)
    gb = job.batch.global_batch
    fits = [c for c in cands if c.composed.peak_bytes <= budget]
    step = max(1, len(fits) // (3 * args.sample))
    pool = [c for c in fits[::step] if ok(layout_space.apply(cfg, c.layout, gb))]
    picked = pool[:: max(1, len(pool) // args.sample)][: args.sample]
    rows = []
    for c in picked:
        try:
            layout_search._full(job, hw, c)
        except RuntimeError as e:
            print(f"  failed: {c.layout.short()}: {str(e).splitlines()[0][:200]}", flush=True)
            continue
        rows.append(c)
        k = c.composed
        print(
            f"#{c.rank:>6}  composed {k.tokens_per_second_per_device:>9,.0f}"
            f"  full {c.tokens_per_second:>9,.0f}  step {k.step_seconds / c.step_seconds - 1:+6.1%}"
            f"  peak {k.peak_bytes / GIB:6.1f} vs {c.peak_bytes / GIB:6.1f} GiB"
            f" ({k.peak_bytes / c.peak_bytes - 1:+6.1%})  {c.layout.short()}",
            flush=True,
        )
    pairs = list(itertools.combinations(rows, 2))
    wrong = sum(
        1
        for a, b in pairs
        if (a.composed.tokens_per_second_per_device - b.composed.tokens_per_second_per_device)
        * (a.tokens_per_second - b.tokens_per_second)
        < 0
    )
    rho = spearman(
        [c.composed.tokens_per_second_per_device for c in rows], [c.tokens_per_second for c in rows]
    )
    errs = sorted(c.composed.step_seconds / c.step_seconds - 1 for c in rows)
    perrs = sorted(c.composed.peak_bytes / c.peak_bytes - 1 for c in rows)
    med = sorted(abs(e) for e in errs)[len(errs) // 2]
    print(
        f"\n{len(rows)} layouts: composed vs full order differ on {wrong}/{len(pairs)} pairs"
        f" ({wrong / max(1, len(pairs)):.0%}), Spearman {rho:+.2f}; step time error median"
        f" |{med:.1%}|, range {errs[0]:+.1%}..{errs[-1]:+.1%}; peak error range"
        f" {perrs[0]:+.1%}..{perrs[-1]:+.1%}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                [
                    {
                        "layout": c.layout.short(),
                        "rank": c.rank,
                        "composed_step": c.composed.step_seconds,
                        "composed_peak": c.composed.peak_bytes,
                        "composed_parts": c.composed.parts,
                        "full_step": c.step_seconds,
                        "full_peak": c.peak_bytes,
                        "full": c.breakdown,
                    }
                    for c in rows
                ],
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
