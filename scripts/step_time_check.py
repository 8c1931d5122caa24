#!/usr/bin/env python3
"""Publish the error of the step-time prediction on this machine: predicted vs measured step
time of real CPU jobs.

    python scripts/step_time_check.py                 # every job, 3 interleaved rounds
    python scripts/step_time_check.py --filter ds_ --rounds 1
    python scripts/step_time_check.py --list
    python scripts/step_time_check.py --json rows.json

First the `local` hardware profile is measured anew (memory/local_profile.py, into a cache
of this check's own), then every job of JOBS runs ROUNDS times, interleaved (round 1 runs
every job, then round 2 ...: the machine's drift spreads over all jobs alike).

- PREDICTED: the trainer's own start-up prediction with the `local` profile (the dry run's
  simulation, memory/step_time.py), read from the run's plan.json
  (`step_time_per_rank_role`: every role has the same step time; the first is taken).
- MEASURED: the median over steps 3..STEPS of metrics.jsonl's `step_time` (every step logs,
  so each is its own sync point; steps 1-2 build, compile and warm up), then the median
  over the rounds.
- ERROR = (predicted - measured) / measured: + means predicted too slow.
- The summary: median |error|, the worst job, how many within +/-35% (the goal: median
  <= 15%, every job within +/-35%).

Jobs: debug models (Llama3, DeepSeek-V3, Qwen3 dense and MoE) at their debug configs' batch
(4 x 256 tokens per rank), fp32 unless the job says bf16, gloo; in scripts/memory_check_matrix.py's
format (short keys and presets).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from memory_check import CheckError, Launcher, load_json  # noqa: E402
from memory_check_matrix import CONFIGS, parse_matrix  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 10
FIRST_MEASURED = 3
WITHIN = 0.35
BASE = [
    "--training.device=cpu",
    f"--training.steps={STEPS}",
    "--metrics.log_freq=1",
    "--metrics.enable_tensorboard=false",
    "--planning.memory_budget_gib=none",
    "--training.mixed_precision_param=float32",
]

JOBS = """
# name                         ranks  overrides
llama_1rank                    1
llama_fsdp2                    2
llama_fsdp2_ac_op              2      ac=op
llama_fsdp2_ac_full            2      ac=full
llama_fsdp2_grad_accum         2      gbs=16
llama_fsdp2_4                  4
llama_fsdp2_compile            2      compile.enable=true
llama_simple_fsdp              2      impl=simple_fsdp
llama_hsdp                     4      rep=2 shard=2
llama_ddp                      2      rep=2 shard=1
llama_tp                       2      tp=2
llama_fsdp2_tp                 4      tp=2
llama_pp_1F1B_mb4              2      pp=2 schedule=1F1B lbs=4 mbs=1
llama_pp_GPipe_mb4             2      pp=2 schedule=GPipe lbs=4 mbs=1
llama_pp_Interleaved1F1B_mb8   2      pp=2 schedule=Interleaved1F1B lbs=8 mbs=1
llama_pp_ZBVZeroBubble_mb4     2      pp=2 schedule=ZBVZeroBubble lbs=4 mbs=1 split=layers.2,layers.4,layers.5
llama_cp2                      2      cp=2
ds_ep2                         2      ep=2
ds_ep2_ac_full                 2      ep=2 ac=full
ds_tp_ep                       2      tp=2 ep=2
ds_pp_ep_1F1B_mb4              4      pp=2 schedule=1F1B lbs=4 mbs=1 ep=2
ds_ep2_compile                 2      ep=2 compile.enable=true
qwen_fsdp2                     2
qmoe_ep2                       2      ep=2
"""


def overrides(job) -> list[str]:
    return [*BASE, *(f"--{k}={v}" for k, v in job.settings)]


def measured_step(metrics_path: str) -> float:
    with open(metrics_path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    times = [
        r["step_time"] for r in records if r.get("step", 0) >= FIRST_MEASURED and "step_time" in r
    ]
    if not times:
        raise CheckError(f"{metrics_path}: no step_time at steps >= {FIRST_MEASURED}")
    return statistics.median(times)


def predicted_step(plan_path: str) -> tuple[float, dict]:
    roles = load_json(plan_path).get("step_time_per_rank_role") or []
    if not roles:
        raise CheckError(f"{plan_path}: no step_time_per_rank_role (was the local profile found?)")
    slowest = max(roles, key=lambda r: r["predicted_step_seconds"])
    return slowest["predicted_step_seconds"], slowest["breakdown"]


def run_once(job, launcher: Launcher, out: str, rnd: int) -> tuple[float, float, dict, str]:
    dump = os.path.join(out, job.name, f"round{rnd}")
    rc, log = launcher.run(
        job,
        [*overrides(job), f"--job.dump_folder={dump}"],
        os.path.join(dump, "logs"),
        dry_run=False,
    )
    if rc != 0:
        return 0.0, 0.0, {}, f"round {rnd} exit {rc}:\n{log}"
    try:
        predicted, breakdown = predicted_step(os.path.join(dump, "plan.json"))
        return predicted, measured_step(os.path.join(dump, "metrics.jsonl")), breakdown, ""
    except (CheckError, OSError, ValueError, KeyError) as e:
        return 0.0, 0.0, {}, f"round {rnd}: {e}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--filter", default="", help="only jobs whose name contains this")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default="", help="write the rows and the summary to this file")
    ap.add_argument("--launcher", choices=("fast", "torchrun"), default="fast")
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--out", default="", help="dump folders (default: a new temporary folder)")
    ap.add_argument(
        "--keep-profile",
        action="store_true",
        help="use the cached local profile instead of measuring",
    )
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args(argv)
    jobs = [j for j in parse_matrix(JOBS) if args.filter in j.name]
    if not jobs:
        print(f"error: no job name contains '{args.filter}'", file=sys.stderr)
        return 2
    if args.list:
        for j in jobs:
            print(
                f"{j.name:32s} {j.ngpu}  CONFIG_FILE={CONFIGS[j.model]}  {shlex.join(overrides(j))}"
            )
        return 0
    out = args.out or tempfile.mkdtemp(prefix="step_time_check_")
    if not args.keep_profile:
        os.environ["TITAN_PROFILE_CACHE"] = os.path.join(out, "local_profile.json")
        from torchtitan.planning.step_time import local_profile

        start = time.monotonic()
        profile = local_profile.load()
        print(
            f"local profile measured in {time.monotonic() - start:.1f}s: GEMM {profile.peak_tflops['float32'] * 1e3:.0f}"
            f" GFLOP/s fp32, memory-bound ops {profile.hbm_gbps:.1f} GB/s, host {profile.host_us_per_op:.1f} us/op,"
            f" gloo {profile.intra_node_gbps:.2f} GB/s, {profile.cores} cores"
        )
    launcher = Launcher(args.launcher, args.timeout)
    rows = {
        j.name: {
            "job": j.name,
            "ranks": j.ngpu,
            "predicted": None,
            "measured": [],
            "breakdown": {},
            "errors": [],
        }
        for j in jobs
    }
    start = time.monotonic()
    for rnd in range(1, args.rounds + 1):
        for job in jobs:
            row = rows[job.name]
            if row["errors"]:
                continue
            predicted, measured, breakdown, err = run_once(job, launcher, out, rnd)
            if err:
                row["errors"].append(err)
                print(f"{job.name:32s} FAILED\n  " + err.replace("\n", "\n  "), flush=True)
                continue
            row["predicted"], row["breakdown"] = predicted, breakdown
            row["measured"].append(measured)
            print(
                f"round {rnd} {job.name:32s} predicted {predicted:.3f}s measured {measured:.3f}s",
                flush=True,
            )
    print(
        f"\n{'job':32s} {'ranks':>5s} {'predicted s':>11s} {'measured s':>10s} {'error':>8s}  rounds (s)  predicted breakdown (ms)"
    )
    errors = []
    for row in rows.values():
        if row["errors"] or not row["measured"]:
            print(f"{row['job']:32s} {row['ranks']:>5d} FAILED")
            continue
        m = statistics.median(row["measured"])
        e = (row["predicted"] - m) / m
        row["error"], row["measured_median"] = e, m
        errors.append((abs(e), row["job"]))
        parts = ", ".join(
            f"{k} {v * 1e3:.0f}" for k, v in sorted(row["breakdown"].items(), key=lambda kv: -kv[1])
        )
        print(
            f"{row['job']:32s} {row['ranks']:>5d} {row['predicted']:>11.3f} {m:>10.3f} {100 * e:>+7.1f}%  "
            f"{', '.join(f'{x:.3f}' for x in row['measured'])}  {parts}"
        )
    failed = [r["job"] for r in rows.values() if r["errors"]]
    summary = {"jobs": len(rows), "failed": failed, "wall_s": time.monotonic() - start}
    if errors:
        worst = max(errors)
        summary.update(
            median_abs_error=statistics.median(e for e, _ in errors),
            worst_abs_error=worst[0],
            worst_job=worst[1],
            within=sum(e <= WITHIN for e, _ in errors),
            compared=len(errors),
        )
        print(
            f"\nsummary: median |error| {100 * summary['median_abs_error']:.1f}% over {len(errors)} jobs, worst"
            f" {100 * worst[0]:.1f}% ({worst[1]}), {summary['within']}/{len(errors)} within +/-{100 * WITHIN:.0f}%;"
            f" {len(errors)}/{len(rows)} jobs ran"
            + (f", failed: {', '.join(failed)}" if failed else "")
            + f" ({summary['wall_s']:.0f}s)"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": list(rows.values()), "summary": summary}, f, indent=1)
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
