#!/usr/bin/env python3
"""How long a checkpoint save stops training: synchronous vs asynchronous saves, side by side.

    python scripts/checkpoint_stall.py                       # debug Llama3, 2 ranks, 40 steps, a save every 10
    python scripts/checkpoint_stall.py --ngpu 4 --repeats 3 -- --training.seq_len=128

The logged step_time leaves the save out (it runs between steps), so the stall is measured on
the wall clock of metrics.jsonl (elapsed_sec, taken at the end of every step, before the save
that follows it): for a save after step s,

    stall = (elapsed[s + k] - elapsed[s]) - k x (a normal step's interval)

with k = --after (default 3) steps: an asynchronous save's copy stops training, then its write
overlaps the next steps and slows them down (it shares the cores), which the k steps catch. A
normal step's interval is the median of elapsed[i] - elapsed[i - 1] over the steps i > 2 that
no save precedes within k steps. The last step's save is synchronous in both modes and is not
counted. Each mode runs --repeats times through run_train.sh; the table gives every save's
stall, the logged staging and background-write times of the asynchronous saves, and the
median per mode.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(
    mode: str, ngpu: int, steps: int, interval: int, dump: str, extra: list[str]
) -> tuple[dict, str]:
    """One run_train.sh run; ({step: elapsed_sec}, console)."""
    cmd = [
        os.path.join(ROOT, "run_train.sh"),
        f"--training.steps={steps}",
        "--checkpoint.enable=true",
        f"--checkpoint.interval={interval}",
        f"--checkpoint.async_mode={mode}",
        "--metrics.enable_tensorboard=false",
        "--validation.enable=false",
        f"--job.dump_folder={dump}",
        *extra,
    ]
    proc = subprocess.run(
        cmd, env={**os.environ, "NGPU": str(ngpu)}, capture_output=True, text=True
    )
    if proc.returncode != 0:
        sys.exit(
            f"run failed ({mode}, exit {proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )
    with open(os.path.join(dump, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if line.strip()]
    return {r["step"]: r["elapsed_sec"] for r in records if "loss" in r}, proc.stdout


def stalls(elapsed: dict, saves: list[int], k: int) -> tuple[list[float], float]:
    """(stall of each save, a normal step's interval)."""
    quiet = [
        i
        for i in elapsed
        if i > 2 and i - 1 in elapsed and not any(0 <= i - 1 - s < k for s in saves)
    ]
    normal = statistics.median(elapsed[i] - elapsed[i - 1] for i in quiet)
    return [elapsed[s + k] - elapsed[s] - k * normal for s in saves], normal


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--ngpu", type=int, default=2)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--interval", type=int, default=10)
    ap.add_argument(
        "--after", type=int, default=3, help="k: steps after a save its stall is measured over"
    )
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", help="folder for the runs (default: a temporary one)")
    ap.add_argument("extra", nargs="*", help="config overrides for every run (after --)")
    args = ap.parse_args(argv)
    out = args.out or tempfile.mkdtemp(prefix="titan_stall_")
    saves = [s for s in range(args.interval, args.steps - args.after, args.interval)]
    rows, summary = [], {}
    for mode in ("disabled", "async"):
        for rep in range(args.repeats):
            elapsed, console = run(
                mode,
                args.ngpu,
                args.steps,
                args.interval,
                os.path.join(out, f"{mode}_{rep}"),
                args.extra,
            )
            got, normal = stalls(elapsed, saves, args.after)
            staged = {
                int(s): float(t)
                for s, t in re.findall(r"checkpoint step-(\d+): staged in ([\d.]+)s", console)
            }
            written = {
                int(s): float(t)
                for s, t in re.findall(
                    r"checkpoint step-(\d+) written in the background in ([\d.]+)s", console
                )
            }
            saved = {
                int(s): float(t)
                for s, t in re.findall(r"checkpoint step-(\d+) saved in ([\d.]+)s", console)
            }
            for s, stall in zip(saves, got):
                rows.append(
                    (mode, rep, s, stall, normal, staged.get(s), written.get(s), saved.get(s))
                )
                summary.setdefault(mode, []).append(stall)
    name = {"disabled": "sync", "async": "async"}
    print(
        f"checkpoint stall, {args.ngpu} ranks, {args.steps} steps, a save every {args.interval} steps, measured"
        f" over the {args.after} steps after each save (seconds)"
    )
    print(
        f"{'mode':6} {'run':>3} {'save':>4} {'stall':>7} {'normal step':>11} {'save (logged)':>13}"
        f" {'staged':>7} {'written in bg':>13}"
    )
    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    for mode, rep, s, stall, normal, staged, written, saved in rows:
        print(
            f"{name[mode]:6} {rep:>3} {s:>4} {stall:>7.3f} {normal:>11.3f} {fmt(saved):>13} {fmt(staged):>7}"
            f" {fmt(written):>13}"
        )
    for mode, values in summary.items():
        print(
            f"median stall per save, {name[mode]}: {statistics.median(values):.3f} s ({len(values)} saves)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
