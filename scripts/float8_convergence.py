#!/usr/bin/env python3
"""Float8 against fp32 and bf16 on the debug model: the same job (train_configs/llama3_debug.toml,
2 CPU ranks, FSDP2) for --steps steps in each precision; prints the final losses side by side
(mean of the last 10 logged steps, and the difference from bf16) and plots the curves. A run
whose dump folder already holds every logged step is kept (an interrupted call resumes).

    python scripts/float8_convergence.py --steps 300 --out outputs/float8_convergence

The float8 runs keep bf16 parameters (as on a GPU): their linears' GEMMs run as real
`torch._scaled_mm` on CPU with each recipe's scales; the output head stays in bf16.
"""

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
F8 = ["--model.converters=quantize.linear.float8"]
RECIPE = "--quantize.linear.float8.recipe_name="
RUNS = {
    "fp32": ["--training.mixed_precision_param=float32"],
    "bf16": ["--training.mixed_precision_param=bfloat16"],
    "float8 tensorwise": ["--training.mixed_precision_param=bfloat16", *F8],
    "float8 rowwise": ["--training.mixed_precision_param=bfloat16", *F8, RECIPE + "rowwise"],
    "float8 rowwise_with_gw_hp": [
        "--training.mixed_precision_param=bfloat16",
        *F8,
        RECIPE + "rowwise_with_gw_hp",
    ],
}


def losses(dump: str) -> list[float]:
    with open(os.path.join(dump, "metrics.jsonl")) as f:
        return [r["loss"] for r in map(json.loads, filter(str.strip, f)) if "loss" in r]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--ngpu", type=int, default=2)
    ap.add_argument("--out", default="outputs/float8_convergence")
    args = ap.parse_args(argv)
    env = {**os.environ, "NGPU": str(args.ngpu), "CONFIG_FILE": "train_configs/llama3_debug.toml"}
    env["PATH"] = os.path.join(ROOT, ".venv", "bin") + os.pathsep + env.get("PATH", "")
    dumps, seconds = {}, {}
    for name, overrides in RUNS.items():
        dump = os.path.join(args.out, name.replace(" ", "_"))
        done_steps = losses(dump) if os.path.exists(os.path.join(dump, "metrics.jsonl")) else []
        if len(done_steps) * 10 >= args.steps:  # a finished run of an earlier call: kept
            dumps[name], seconds[name] = dump, float("nan")
            continue
        start = time.perf_counter()
        cmd = [
            "./run_train.sh",
            f"--training.steps={args.steps}",
            "--metrics.log_freq=10",
            "--metrics.enable_tensorboard=false",
            "--planning.memory_budget_gib=none",
            f"--job.dump_folder={dump}",
            *overrides,
        ]
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stdout[-2000:] + done.stderr[-2000:], file=sys.stderr)
            return 1
        dumps[name], seconds[name] = dump, time.perf_counter() - start
    tail = {n: sum(losses(d)[-10:]) / len(losses(d)[-10:]) for n, d in dumps.items()}
    print(
        f"{'precision':28s} {'final loss':>10s} {'last-10 mean':>12s} {'vs bf16':>8s} {'wall s':>7s}"
    )
    for name, dump in dumps.items():
        print(
            f"{name:28s} {losses(dump)[-1]:10.4f} {tail[name]:12.4f}"
            f" {100 * (tail[name] / tail['bf16'] - 1):+7.2f}%"
            f" {'-' if seconds[name] != seconds[name] else f'{seconds[name]:.0f}':>7s}"
        )
    png = os.path.join(args.out, "loss.png")
    subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "scripts", "plot_loss.py"),
            *dumps.values(),
            "--labels",
            ",".join(dumps),
            "--title",
            f"llama3 debugmodel, {args.steps} steps: fp32, bf16 and float8",
            "--out",
            png,
        ],
        check=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
