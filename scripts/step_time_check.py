#!/usr/bin/env python3
"""Publish the error of the step-time prediction on this machine: predicted vs measured step
time of real CPU jobs, with the machine's own state kept out of the number.

    python scripts/step_time_check.py                 # every job, 3 interleaved rounds
    python scripts/step_time_check.py --filter ds_ --rounds 1
    python scripts/step_time_check.py --list
    python scripts/step_time_check.py --json rows.json

Each round first measures the `local` hardware profile anew (local_profile.py, into this
round's own cache, ~30 s), then runs the canary job and every job of JOBS once; rounds repeat
ROUNDS times (the machine's drift spreads over all jobs alike, and each round's jobs are
predicted from the machine state they are measured in).

- PREDICTED: the trainer's own start-up prediction with the round's `local` profile (the dry
  run's simulation), read from the run's plan.json (`step_time_per_rank_role`; the slowest role).
- MEASURED: the median over steps 3..STEPS of metrics.jsonl's `step_time` (steps 1-2 build,
  compile and warm up). The profile's micro-benchmarks take the median of their repeats too
  (cpu_bench.timed): one statistic on both sides.
- A job's error: the median over rounds of (predicted - measured) / measured (+: predicted too
  slow).
- The load guard (load_guard.py): no job starts while other processes keep the cores busy, and a
  job during which others used more than 0.15 of a core on average is run again (twice at most,
  then reported as loaded).
- The canary: CANARY runs first in every round; its error per round shows whether the machine
  changed between the profile and the jobs (the summary prints it per round).
- The summary separates bias from spread: the median signed error (bias; goal |bias| <= 5%),
  the median |error| (goal <= 15%), the spread (median |error - bias|), the worst job.

Jobs: debug models (Llama3, DeepSeek-V3, Qwen3 dense and MoE) at their debug configs' batch
(4 x 256 tokens per rank), fp32, gloo; in scripts/memory_check_matrix.py's format (short keys
and presets).
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
import load_guard  # noqa: E402
from memory_check import CheckError, Launcher, load_json  # noqa: E402
from memory_check_matrix import CONFIGS, parse_matrix  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 10
FIRST_MEASURED = 3
WITHIN = 0.35
GOAL_ABS, GOAL_BIAS = 0.15, 0.05
RETRIES = 2  # a job measured while other work ran is run again at most this often
CANARY = "llama_canary 1"  # a matrix line: the first job of every round (1 rank, fp32 Llama3 debug)
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
qwen_tp                        2      tp=2
qmoe_fsdp2                     2
llama_fsdp2_tp_ac_op           4      tp=2 ac=op
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


def run_once(job, launcher: Launcher, out: str, rnd: int) -> dict:
    """One measured run behind the load guard: {predicted, measured, breakdown, foreign, error}."""
    for attempt in range(RETRIES + 1):
        waited = load_guard.wait_quiet()
        dump = os.path.join(out, job.name, f"round{rnd}" + (f"_{attempt}" if attempt else ""))
        window = load_guard.Window().start()
        rc, log = launcher.run(
            job,
            [*overrides(job), f"--job.dump_folder={dump}"],
            os.path.join(dump, "logs"),
            dry_run=False,
        )
        foreign = window.stop()
        if rc != 0:
            return {"error": f"round {rnd} exit {rc}:\n{log}"}
        if foreign <= load_guard.FOREIGN_CORES or attempt == RETRIES:
            break
        print(f"  [load guard] {job.name}: others used {foreign:.2f} cores meanwhile: again")
    try:
        predicted, breakdown = predicted_step(os.path.join(dump, "plan.json"))
        measured = measured_step(os.path.join(dump, "metrics.jsonl"))
    except (CheckError, OSError, ValueError, KeyError) as e:
        return {"error": f"round {rnd}: {e}"}
    return {
        "predicted": predicted,
        "measured": measured,
        "breakdown": breakdown,
        "foreign_cores": foreign,
        "waited_s": waited,
        "attempts": attempt + 1,
        "error": "",
    }


def measure_profile(out: str, rnd: int) -> None:
    """This round's `local` profile, measured now into its own cache (the jobs read it)."""
    os.environ["TITAN_PROFILE_CACHE"] = os.path.join(out, f"local_profile_round{rnd}.json")
    from torchtitan.planning.step_time import local_profile

    load_guard.wait_quiet()
    start = time.monotonic()
    profile = local_profile.load()
    print(
        f"round {rnd}: local profile measured in {time.monotonic() - start:.1f}s: GEMM"
        f" {profile.peak_tflops['float32'] * 1e3:.0f} GFLOP/s fp32, memory-bound ops"
        f" {profile.hbm_gbps:.1f} GB/s ({profile.step_memory_gbps:.1f} GB/s inside the step),"
        f" host {profile.host_us_per_op:.1f} us/op, gloo {profile.intra_node_gbps:.2f} GB/s"
        f" (skew {profile.gloo.get('2', {}).get('skew', 0.0):.3f}), {profile.cores} cores, thread speedup"
        f" {profile.thread_speedup:.2f}, sharing {profile.sharing}, fitted time_factor"
        f" {profile.time_factor:.3f}",
        flush=True,
    )


def summarize(rows: list[dict]) -> dict:
    """Bias (median signed error) apart from spread (median |error - bias|), and the goals."""
    signed = sorted(r["error"] for r in rows)
    bias = statistics.median(signed)
    worst = max(rows, key=lambda r: abs(r["error"]))
    return {
        "compared": len(rows),
        "median_abs_error": statistics.median(abs(e) for e in signed),
        "median_signed_error": bias,
        "spread": statistics.median(abs(e - bias) for e in signed),
        "worst_abs_error": abs(worst["error"]),
        "worst_job": worst["job"],
        "within": sum(abs(e) <= WITHIN for e in signed),
        "too_fast": sum(e < 0 for e in signed),
    }


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
        help="use the cached local profile in every round instead of measuring it per round",
    )
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        print(f"error: --rounds {args.rounds}: give 1 or more rounds", file=sys.stderr)
        return 2
    canary = parse_matrix(CANARY)[0]
    jobs = [j for j in parse_matrix(JOBS) if args.filter in j.name]
    if not jobs:
        print(f"error: no job name contains '{args.filter}'", file=sys.stderr)
        return 2
    if args.list:
        for j in [canary, *jobs]:
            print(
                f"{j.name:32s} {j.ngpu}  CONFIG_FILE={CONFIGS[j.model]}  {shlex.join(overrides(j))}"
            )
        return 0
    out = args.out or tempfile.mkdtemp(prefix="step_time_check_")
    launcher = Launcher(args.launcher, args.timeout)
    rows = {
        j.name: {"job": j.name, "ranks": j.ngpu, "rounds": [], "failed": ""}
        for j in [canary, *jobs]
    }
    start = time.monotonic()
    for rnd in range(1, args.rounds + 1):
        if not args.keep_profile:
            measure_profile(out, rnd)
        for job in [canary, *jobs]:
            row = rows[job.name]
            if row["failed"]:
                continue
            got = run_once(job, launcher, out, rnd)
            if got["error"]:
                row["failed"] = got["error"]
                print(f"{job.name:32s} FAILED\n  " + got["error"].replace("\n", "\n  "), flush=True)
                continue
            got["error"] = (got["predicted"] - got["measured"]) / got["measured"]
            got["round"] = rnd
            row["rounds"].append(got)
            print(
                f"round {rnd} {job.name:32s} predicted {got['predicted']:.3f}s measured"
                f" {got['measured']:.3f}s {100 * got['error']:+.1f}%"
                f" (others {got['foreign_cores']:.2f} cores)",
                flush=True,
            )
    print(
        f"\n{'job':32s} {'ranks':>5s} {'predicted s':>11s} {'measured s':>10s} {'error':>8s}"
        "  per round (%)  predicted breakdown (ms, last round)"
    )
    compared = []
    for row in rows.values():
        if row["failed"] or not row["rounds"]:
            print(f"{row['job']:32s} {row['ranks']:>5d} FAILED")
            continue
        rr = row["rounds"]
        row["error"] = statistics.median(r["error"] for r in rr)
        row["predicted"] = statistics.median(r["predicted"] for r in rr)
        row["measured"] = statistics.median(r["measured"] for r in rr)
        if row["job"] != canary.name:
            compared.append(row)
        parts = ", ".join(
            f"{k} {v * 1e3:.0f}"
            for k, v in sorted(rr[-1]["breakdown"].items(), key=lambda kv: -kv[1])
        )
        per_round = ", ".join(f"{100 * r['error']:+.0f}" for r in rr)
        print(
            f"{row['job']:32s} {row['ranks']:>5d} {row['predicted']:>11.3f} {row['measured']:>10.3f}"
            f" {100 * row['error']:>+7.1f}%  {per_round}  {parts}"
        )
    failed = [r["job"] for r in rows.values() if r["failed"]]
    summary = {"jobs": len(jobs), "failed": failed, "wall_s": time.monotonic() - start}
    canary_rounds = [r["error"] for r in rows[canary.name]["rounds"]]
    summary["canary_error_per_round"] = canary_rounds
    loaded = sum(
        r["foreign_cores"] > load_guard.FOREIGN_CORES
        for row in rows.values()
        for r in row["rounds"]
    )
    summary["loaded_measurements"] = loaded
    if compared:
        summary.update(summarize(compared))
        print(
            f"\nsummary over {summary['compared']} jobs ({args.rounds} rounds, {summary['wall_s']:.0f}s):"
            f" median |error| {100 * summary['median_abs_error']:.1f}% (goal <= {100 * GOAL_ABS:.0f}%),"
            f" bias (median signed error) {100 * summary['median_signed_error']:+.1f}%"
            f" (goal within +/-{100 * GOAL_BIAS:.0f}%), spread (median |error - bias|)"
            f" {100 * summary['spread']:.1f}%, worst {100 * summary['worst_abs_error']:.1f}%"
            f" ({summary['worst_job']}), {summary['within']}/{summary['compared']} within"
            f" +/-{100 * WITHIN:.0f}%, {summary['too_fast']} predicted too fast"
        )
        print(
            "canary error per round: "
            + ", ".join(f"{100 * e:+.1f}%" for e in canary_rounds)
            + f"; measurements taken while others used > {load_guard.FOREIGN_CORES} cores: {loaded}"
            + (f"; failed: {', '.join(failed)}" if failed else "")
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": list(rows.values()), "summary": summary}, f, indent=1)
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
