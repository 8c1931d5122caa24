#!/usr/bin/env python3
"""Measure what a policy costs: run short jobs over a grid of settings with comm stats on
and print FSDP all-gathers / reduce-scatters per step (rank 0) and the final loss.

    python scripts/comm_matrix.py --ngpu 4 --pp 2 --schedules 1F1B,Interleaved1F1B --microbatches 4,8
    python scripts/comm_matrix.py --ngpu 4 --pp 1 --policies always,auto

Counts are those of the last step (the first pipeline step also runs shape inference).
Extra trailing arguments after `--` are passed to every run (e.g. -- --model.flavor=debugmodel).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN_TRAIN = os.path.join(ROOT, "run_train.sh")


def run_case(ngpu: int, overrides: list[str], dump: str) -> dict:
    env = {**os.environ, "NGPU": str(ngpu)}
    proc = subprocess.run(
        [RUN_TRAIN, *overrides, f"--job.dump_folder={dump}", "--metrics.comm_stats=true"],
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"run failed ({' '.join(overrides)}):\n{(proc.stdout + proc.stderr)[-3000:]}"
        )
    with open(os.path.join(dump, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()][-1]


def fsdp_dim(record: dict, kind: str, phase: str) -> tuple[int, int]:
    key = f"{phase}/{kind}/dp_shard"
    return record["comm"].get(key, 0), record["comm_bytes"].get(key, 0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--ngpu", type=int, default=4)
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--schedules", default="1F1B,Interleaved1F1B")
    ap.add_argument("--microbatches", default="4,8", help="microbatches per step (PP only)")
    ap.add_argument("--policies", default="always,never,auto")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", default="")
    ap.add_argument("extra", nargs="*", help="overrides for every run (after --)")
    args = ap.parse_args(argv)

    out = args.out or tempfile.mkdtemp(prefix="comm_matrix_")
    base = [
        "--model.flavor=tiny",
        f"--training.steps={args.steps}",
        "--training.seq_len=64",
        "--training.mixed_precision_param=float32",
        "--training.deterministic=true",
        "--metrics.enable_tensorboard=false",
        f"--parallelism.pipeline_parallel_degree={args.pp}",
        *args.extra,
    ]
    grid = []
    if args.pp > 1:
        for schedule in args.schedules.split(","):
            for mb in map(int, args.microbatches.split(",")):
                grid.append(
                    (
                        schedule,
                        mb,
                        [
                            f"--parallelism.pipeline_parallel_schedule={schedule}",
                            f"--training.local_batch_size={mb}",
                        ],
                    )
                )
    else:
        grid.append(("-", 1, ["--training.local_batch_size=2"]))

    print(
        f"{'schedule':16s} {'mb':>3s} {'policy':7s} {'AG fwd':>6s} {'AG bwd':>6s} {'AG MiB':>8s}"
        f" {'RS':>4s} {'RS MiB':>8s}  loss@{args.steps}"
    )
    for schedule, mb, overrides in grid:
        for policy in args.policies.split(","):
            name = f"{schedule}_{mb}_{policy}"
            rec = run_case(
                args.ngpu,
                base + overrides + [f"--parallelism.reshard_after_forward={policy}"],
                os.path.join(out, name),
            )
            ag_f, ag_f_b = fsdp_dim(rec, "all_gather", "forward")
            ag_b, ag_b_b = fsdp_dim(rec, "all_gather", "backward")
            rs, rs_b = fsdp_dim(rec, "reduce_scatter", "backward")
            print(
                f"{schedule:16s} {mb:>3d} {policy:7s} {ag_f:>6d} {ag_b:>6d} {(ag_f_b + ag_b_b) / 2**20:>8.2f}"
                f" {rs:>4d} {rs_b / 2**20:>8.2f}  {rec['loss']:.6f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
