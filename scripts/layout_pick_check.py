#!/usr/bin/env python3
"""Check the layout search's pick on this machine: search a 4-rank debug job, then train every
layout the search lists and compare the measured speeds.

    python scripts/layout_pick_check.py                  # 8 full simulations, 2 rounds
    python scripts/layout_pick_check.py --candidates 6 --rounds 1

1. The `local` profile is measured anew (as scripts/step_time_check.py does) unless
   --keep-profile.
2. `--job.dry_run=true --planning.fit=layout` for NGPU=4 CONFIG_FILE=train_configs/llama3_debug.toml
   (CPU, gloo, fp32, the debug config's global batch) scores every layout; the pick and
   layouts spread over its whole ranking are measured (layout_search.json: `pick`, `spread`).
3. Every listed layout trains STEPS steps with its exact overrides, ROUNDS interleaved rounds;
   measured: the median step_time of steps FIRST_MEASURED.. (metrics.jsonl), then the median
   over the rounds, as tokens/s per device. No layout is measured while other processes
   use the cores (load_guard.py: it waits, and measures again a run that shared them).
4. The goals: the pick measured within 5% of the fastest measured, and the Spearman rank
   correlation of the composed prediction and the measurement >= 0.8. Printed beside: each
   run's own start-up prediction (the full model, plan.json) and its rank correlation, which
   tells the composition's error from the model's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import load_guard  # noqa: E402
from memory_check import Launcher  # noqa: E402
from memory_check_matrix import Job  # noqa: E402
from step_time_check import measured_step  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RANKS = 4
STEPS = 8
WITHIN = 0.05
SPEARMAN_GOAL = 0.8
BASE = [
    "--training.device=cpu",
    "--training.mixed_precision_param=float32",
    "--metrics.enable_tensorboard=false",
]


def _settings(overrides: list[str]) -> tuple[tuple[str, str], ...]:
    return tuple(tuple(o[2:].split("=", 1)) for o in overrides)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--candidates", type=int, default=5, help="layouts the search simulates in full"
    )
    ap.add_argument(
        "--layouts", type=int, default=16, help="layouts measured: the pick and a spread"
    )
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="")
    ap.add_argument("--keep-profile", action="store_true", help="use the cached local profile")
    ap.add_argument("--timeout", type=float, default=900.0)
    args = ap.parse_args(argv)
    out = args.out or tempfile.mkdtemp(prefix="layout_pick_check_")
    if not args.keep_profile:
        os.environ["TITAN_PROFILE_CACHE"] = os.path.join(out, "local_profile.json")
        from torchtitan.planning.step_time import local_profile

        start = time.monotonic()
        local_profile.load()
        print(f"local profile measured in {time.monotonic() - start:.1f}s", flush=True)
    launcher = Launcher("torchrun", args.timeout)
    search = Job("llama_layout_search", RANKS, "llama3", ())
    dump = os.path.join(out, "search")
    start = time.monotonic()
    rc, log = launcher.run(
        search,
        [
            *BASE,
            "--job.dry_run=true",
            "--planning.fit=layout",
            "--hardware.profile=local",
            f"--planning.layout_candidates={args.candidates}",
            f"--job.dump_folder={dump}",
        ],
        os.path.join(dump, "logs"),
        dry_run=True,
    )
    print(
        log if rc else "\n".join(line for line in log.splitlines() if "Warning" not in line),
        flush=True,
    )
    if rc != 0:
        print(f"error: the layout search exited {rc}", file=sys.stderr)
        return 1
    print(f"(search {time.monotonic() - start:.0f}s)")
    with open(os.path.join(dump, "layout_search.json")) as f:
        result = json.load(f)
    spread = [c for c in result["spread"] if c["layout"] != result["pick"]["layout"]]
    ranked = [result["pick"], *spread[: args.layouts - 1]]
    tokens = result["global_batch"] * _seq_len(dump)
    measured: dict[int, list[float]] = {i: [] for i in range(len(ranked))}
    full: dict[int, float | None] = {}  # the run's own start-up prediction (the full model)
    for rnd in range(1, args.rounds + 1):
        for i, cand in enumerate(ranked):
            job = Job(f"llama_pick_{i + 1}", RANKS, "llama3", _settings(cand["overrides"]))
            run_dump = os.path.join(out, f"pick{i + 1}", f"round{rnd}")
            flags = [
                *BASE,
                *cand["overrides"],
                f"--training.steps={STEPS}",
                "--metrics.log_freq=1",
                f"--job.dump_folder={run_dump}",
            ]
            for _attempt in range(3):  # behind the load guard (load_guard.py), as step_time_check
                load_guard.wait_quiet()
                window = load_guard.Window().start()
                rc, log = launcher.run(job, flags, os.path.join(run_dump, "logs"), dry_run=False)
                foreign = window.stop()
                if rc != 0 or foreign <= load_guard.FOREIGN_CORES:
                    break
                print(f"  [load guard] others used {foreign:.2f} cores meanwhile: again")
            if rc != 0:
                print(f"#{i + 1} round {rnd} FAILED (exit {rc}):\n{log}", flush=True)
                continue
            step = measured_step(os.path.join(run_dump, "metrics.jsonl"))
            measured[i].append(step)
            full[i] = full_prediction(os.path.join(run_dump, "plan.json")) or full.get(i)
            print(f"round {rnd} #{i + 1} {cand['layout']}: {step:.3f}s", flush=True)
    rows = []
    for i, cand in enumerate(ranked):
        if not measured[i]:
            continue
        step = statistics.median(measured[i])
        rows.append((i + 1, cand, tokens / step / RANKS, step))
        cand["full_tokens_per_second_per_device"] = (
            tokens / full[i] / RANKS if full.get(i) else None
        )
    if not rows:
        print("error: no layout ran", file=sys.stderr)
        return 1
    fastest = max(r[2] for r in rows)
    order = sorted(rows, key=lambda r: -r[2])
    print(
        f"\n{'rank':>6}  {'composed tok/s/dev':>18}  {'full tok/s/dev':>14}  {'measured tok/s/dev':>18}  {'measured #':>10}  {'vs fastest':>10}  layout"
    )
    for i, cand, tps, _ in rows:
        print(
            f"{cand['rank']:>6}  {cand['composed_tokens_per_second_per_device']:>18,.0f}"
            f"  {cand['full_tokens_per_second_per_device'] or 0:>14,.0f}  {tps:>18,.0f}"
            f"  {order.index((i, cand, tps, _)) + 1:>10}"
            f"  {100 * (tps - fastest) / fastest:>+9.1f}%  {cand['layout']}{'  <- pick' if i == 1 else ''}"
        )
    from composed_vs_full import spearman

    rho = spearman(
        [r[1]["composed_tokens_per_second_per_device"] for r in rows], [r[2] for r in rows]
    )
    timed = [r for r in rows if r[1]["full_tokens_per_second_per_device"]]
    rho_full = spearman(
        [r[1]["full_tokens_per_second_per_device"] for r in timed], [r[2] for r in timed]
    )
    first = rows[0]
    ok = first[0] == 1 and first[2] >= (1 - WITHIN) * fastest
    print(
        f"\nthe pick measured {100 * (first[2] - fastest) / fastest:+.1f}% vs the fastest of the"
        f" {len(rows)} measured ({'within' if ok else 'NOT within'} {100 * WITHIN:.0f}%);"
        f" Spearman (composed vs measured) {rho:+.2f} (goal >= {SPEARMAN_GOAL}); the full"
        f" model (each run's own start-up prediction) vs measured {rho_full:+.2f}"
    )
    return 0 if ok and rho >= SPEARMAN_GOAL else 1


def full_prediction(plan_path: str) -> float | None:
    """The run's own start-up prediction of its step (plan.json, the slowest role), or None."""
    try:
        with open(plan_path) as f:
            roles = json.load(f).get("step_time_per_rank_role") or []
    except (OSError, ValueError):
        return None
    return max((r["predicted_step_seconds"] for r in roles), default=None)


def _seq_len(dump: str) -> int:
    """The sequence length the search ran with (the debug config's, from its snippet's job)."""
    sys.path.insert(0, ROOT)
    from torchtitan.checks import load_config

    cfg, _ = load_config(
        ["--job.config_file=" + os.path.join(ROOT, "train_configs/llama3_debug.toml"), *BASE], RANKS
    )
    return cfg.training.seq_len


if __name__ == "__main__":
    sys.exit(main())
