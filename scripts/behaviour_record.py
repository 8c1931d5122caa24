#!/usr/bin/env python3
"""Record what a refactor must not change, and compare two records bitwise.

    python scripts/behaviour_record.py record --tree . --out /tmp/after.json
    python scripts/behaviour_record.py record --tree /path/to/old/checkout --out /tmp/before.json
    python scripts/behaviour_record.py compare /tmp/before.json /tmp/after.json

`record` trains a handful of small CPU jobs through `<tree>/run_train.sh` (the tree's own
torchtitan first on PYTHONPATH) and keeps every number their metrics.jsonl logs per step
(loss, grad norm, MTP loss, validation loss; timings and memory meters left out), plus the
plan.json of a DeepSeek-V3 dry run. `compare` prints one row per job: the numbers compared
and whether each is bitwise equal; it exits 1 on any difference.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

STEPS = 6
COMMON = [
    f"--training.steps={STEPS}",
    "--training.seq_len=64",
    "--training.deterministic=true",
    "--training.mixed_precision_param=float32",
    "--metrics.enable_tensorboard=false",
    "--metrics.log_freq=1",
    "--checkpoint.enable=false",
]
NO_BUDGET = ["--planning.memory_budget_gib=none"]

# name -> (ngpu, config, overrides)
JOBS: dict[str, tuple[int, str, list[str]]] = {
    "fsdp2_validation": (
        2,
        "llama3_debug.toml",
        ["--validation.enable=true", "--validation.freq=2", "--validation.steps=2"],
    ),
    "pp2_tp2": (
        4,
        "llama3_debug.toml",
        [
            "--parallelism.pipeline_parallel_degree=2",
            "--parallelism.tensor_parallel_degree=2",
            "--training.local_batch_size=4",
        ],
    ),
    "deepseek_v3_ep2_mtp": (
        2,
        "deepseek_v3_debug.toml",
        [
            "--parallelism.expert_parallel_degree=2",
            "--model.mtp_depth=1",
            "--training.local_batch_size=2",
        ],
    ),
    "simple_fsdp_op_sac": (
        2,
        "llama3_debug.toml",
        [
            "--parallelism.fsdp_implementation=simple_fsdp",
            "--activation_checkpoint.mode=selective",
            "--activation_checkpoint.selective_ac_option=op",
        ],
    ),
    "qwen3_pp2_tied": (
        2,
        "qwen3_debug.toml",
        ["--parallelism.pipeline_parallel_degree=2", "--training.local_batch_size=4"],
    ),
}
SKIP_KEYS = (
    "time",
    "tps",
    "tflops",
    "mfu",
    "memory",
    "mem",
    "eta",
    "wall",
    "elapsed",
    "seconds",
    "_s",
    "rss",
    "throughput",
    "tokens_per",
    "peak",
    "predicted",
)


def _kept(key: str) -> bool:
    return not any(s in key for s in SKIP_KEYS)


def _numbers(metrics_path: str) -> dict[str, float]:
    out: dict[str, float] = {}
    with open(metrics_path) as f:
        for line in f:
            if not line.strip():
                continue
            rec = json.loads(line)
            step = rec.get("step")
            for k, v in rec.items():
                if (
                    k == "step"
                    or not isinstance(v, (int, float))
                    or isinstance(v, bool)
                    or not _kept(k)
                ):
                    continue
                out[f"{step}:{k}"] = v
    return out


def _run(tree: str, ngpu: int, config: str, overrides: list[str], dump: str) -> None:
    env = dict(
        os.environ,
        NGPU=str(ngpu),
        CONFIG_FILE=os.path.join(tree, "train_configs", config),
        PYTHONPATH=tree,
        LOG_RANK="0",
    )
    cmd = [os.path.join(tree, "run_train.sh"), f"--job.dump_folder={dump}", *overrides]
    proc = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(
            f"job failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )


def record(tree: str, out: str, only: list[str] | None) -> None:
    tree = os.path.abspath(tree)
    result: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as work:
        for name, (ngpu, config, overrides) in JOBS.items():
            if only and name not in only:
                continue
            dump = os.path.join(work, name)
            _run(tree, ngpu, config, COMMON + NO_BUDGET + overrides, dump)
            result[name] = _numbers(os.path.join(dump, "metrics.jsonl"))
            print(f"{name}: {len(result[name])} numbers", flush=True)
        if not only or "deepseek_v3_dry_run_plan" in only:
            dump = os.path.join(work, "dry")
            _run(
                tree,
                8,
                "deepseek_v3_debug.toml",
                [
                    "--job.dry_run=true",
                    "--parallelism.expert_parallel_degree=2",
                    "--planning.memory_budget_gib=8",
                ],
                dump,
            )
            with open(os.path.join(dump, "plan.json")) as f:
                plan = json.load(f)
            result["deepseek_v3_dry_run_plan"] = {
                "plan.json": json.dumps(_without_times(plan), sort_keys=True)
            }
            print("deepseek_v3_dry_run_plan: recorded", flush=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)


def _without_times(obj):
    """plan.json less what measures this machine or the wall clock (none of it is a decision)."""
    if isinstance(obj, dict):
        return {
            k: _without_times(v)
            for k, v in obj.items()
            if k not in ("created", "wall_seconds", "host", "simulation_seconds")
        }
    if isinstance(obj, list):
        return [_without_times(v) for v in obj]
    return obj


def _json_diff(a, b, path: str = "") -> list[str]:
    """'path: before -> after' for every leaf where two JSON values differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys = sorted(set(a) | set(b))
        return [d for k in keys for d in _json_diff(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _json_diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path or '.'}: {json.dumps(a)[:60]} -> {json.dumps(b)[:60]}"]


def compare(before: str, after: str, show: int = 0) -> int:
    with open(before) as f:
        a = json.load(f)
    with open(after) as f:
        b = json.load(f)
    bad = 0
    print(f"{'job':<28} {'numbers':>8}  bitwise equal")
    for name in sorted(set(a) | set(b)):
        x, y = a.get(name, {}), b.get(name, {})
        same = x == y and bool(x)
        diff = [k for k in sorted(set(x) | set(y)) if x.get(k) != y.get(k)]
        bad += not same
        kinds = sorted({k.split(":", 1)[-1] for k in x})
        print(
            f"{name:<28} {len(x):>8}  {'yes' if same else 'NO: ' + ', '.join(diff[:5])}   ({', '.join(kinds)})"
        )
        if show and not same and "plan.json" in x and "plan.json" in y:
            changes = _json_diff(json.loads(x["plan.json"]), json.loads(y["plan.json"]))
            print(f"    {len(changes)} plan.json leaves differ:")
            for line in changes[:show]:
                print(f"      {line}")
    return 1 if bad else 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("--tree", default=".")
    r.add_argument("--out", required=True)
    r.add_argument("--only", nargs="*")
    c = sub.add_parser("compare")
    c.add_argument("before")
    c.add_argument("after")
    c.add_argument(
        "--show", type=int, default=0, help="list up to this many differing plan.json leaves"
    )
    args = p.parse_args()
    if args.cmd == "record":
        record(args.tree, args.out, args.only)
    else:
        sys.exit(compare(args.before, args.after, args.show))


if __name__ == "__main__":
    main()
