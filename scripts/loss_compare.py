#!/usr/bin/env python3
"""Compare the per-step losses of two runs, side by side, and plot them.

Each side is a metrics.jsonl, a dump folder holding one, or a TOML config to train now:

    # two finished runs
    python scripts/loss_compare.py outputs/a/metrics.jsonl outputs/b --assert-equal
    # train the same config twice, with different overrides and rank counts
    python scripts/loss_compare.py train_configs/llama3_debug.toml train_configs/llama3_debug.toml \\
        --ngpu-a 4 --ngpu-b 2 --args "--training.steps=10 --training.global_batch_size=16" \\
        --args-b "--parallelism.tensor_parallel_degree=2" --assert-equal --png cmp.png

Configs are trained through run_train.sh into <--work-dir>/a and /b. --assert-equal exits 1
unless both runs logged the same steps with bitwise-equal losses; --rtol X instead allows a
relative difference of up to X, and --steps 6:10 limits the comparison. Steps logged more than once (a resumed run) count once, the
last record winning.
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_losses(path: str) -> dict[int, float]:
    if os.path.isdir(path):
        path = os.path.join(path, "metrics.jsonl")
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"metrics file '{path}' not found; pass a metrics.jsonl, a dump folder or a .toml config"
        )
    losses = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                rec = json.loads(line)
                if "loss" in rec:
                    losses[int(rec["step"])] = float(rec["loss"])
    return losses


def train(config: str, ngpu: int, overrides: list[str], dump: str) -> str:
    """Run run_train.sh for one side; return its dump folder."""
    env = dict(os.environ, NGPU=str(ngpu), CONFIG_FILE=config)
    cmd = [os.path.join(ROOT, "run_train.sh"), *overrides, f"--job.dump_folder={dump}"]
    print(f"$ NGPU={ngpu} CONFIG_FILE={config} {' '.join(shlex.quote(c) for c in cmd)}", flush=True)
    result = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        raise RuntimeError(
            f"training {config} (NGPU={ngpu}) failed with exit code {result.returncode}:\n{tail}"
        )
    return dump


def side(
    source: str, name: str, ngpu: int, overrides: list[str], work_dir: str
) -> dict[int, float]:
    if source.endswith(".toml"):
        if not os.path.isfile(source):
            raise FileNotFoundError(f"config '{source}' not found")
        return read_losses(
            train(os.path.abspath(source), ngpu, overrides, os.path.join(work_dir, name))
        )
    return read_losses(source)


def compare(a: dict[int, float], b: dict[int, float], rtol: float) -> tuple[list[tuple], list[str]]:
    """Rows (step, loss a, loss b, relative diff, ok) and the problems found."""
    rows, problems = [], []
    for step in sorted(set(a) | set(b)):
        la, lb = a.get(step), b.get(step)
        if la is None or lb is None:
            rows.append((step, la, lb, None, False))
            problems.append(f"step {step} only in run {'b' if la is None else 'a'}")
            continue
        rel = abs(la - lb) / max(abs(la), 1e-30)
        ok = la == lb if rtol == 0 else rel <= rtol
        rows.append((step, la, lb, rel, ok))
        if not ok:
            problems.append(f"step {step}: {la!r} vs {lb!r} (relative difference {rel:.2e})")
    return rows, problems


def plot(a: dict[int, float], b: dict[int, float], labels: list[str], out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(8, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    for losses, label, style in ((a, labels[0], "-"), (b, labels[1], "--")):
        steps = sorted(losses)
        top.plot(steps, [losses[s] for s in steps], style, label=label)
    top.set_ylabel("loss")
    top.legend()
    top.set_title("loss comparison")
    common = sorted(set(a) & set(b))
    bottom.plot(common, [abs(a[s] - b[s]) for s in common], ".-", color="tab:red")
    bottom.set_ylabel("|a - b|")
    bottom.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("a", help="metrics.jsonl, dump folder or .toml config")
    ap.add_argument("b", help="metrics.jsonl, dump folder or .toml config")
    ap.add_argument("--ngpu", type=int, default=1, help="ranks for a config side (default 1)")
    ap.add_argument("--ngpu-a", type=int, help="ranks for side a (default --ngpu)")
    ap.add_argument("--ngpu-b", type=int, help="ranks for side b (default --ngpu)")
    ap.add_argument("--args", default="", help="overrides for both config sides, one string")
    ap.add_argument("--args-a", default="", help="extra overrides for side a")
    ap.add_argument("--args-b", default="", help="extra overrides for side b")
    ap.add_argument("--work-dir", help="where config sides train (default: a new temporary folder)")
    ap.add_argument("--labels", help="two comma-separated names for the table and plot")
    ap.add_argument(
        "--assert-equal",
        action="store_true",
        help="exit 1 unless the losses are equal (see --rtol)",
    )
    ap.add_argument(
        "--rtol",
        type=float,
        default=0.0,
        help="relative tolerance for --assert-equal (default 0: bitwise)",
    )
    ap.add_argument(
        "--steps", help="compare only steps FIRST:LAST (inclusive), e.g. 6:10 for a resumed run"
    )
    ap.add_argument("--png", help="write the two curves and their difference to this PNG")
    args = ap.parse_args(argv)

    labels = args.labels.split(",") if args.labels else ["a", "b"]
    if len(labels) != 2:
        print(f"error: --labels needs two names, got {len(labels)}", file=sys.stderr)
        return 2
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="loss_compare_")
    common = shlex.split(args.args)
    try:
        a = side(args.a, "a", args.ngpu_a or args.ngpu, common + shlex.split(args.args_a), work_dir)
        b = side(args.b, "b", args.ngpu_b or args.ngpu, common + shlex.split(args.args_b), work_dir)
    except (OSError, RuntimeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    if args.steps:
        try:
            first, last = (int(x) for x in args.steps.split(":"))
        except ValueError:
            print(f"error: --steps {args.steps!r}: use FIRST:LAST, e.g. 6:10", file=sys.stderr)
            return 2
        a = {s: v for s, v in a.items() if first <= s <= last}
        b = {s: v for s, v in b.items() if first <= s <= last}
    rows, problems = compare(a, b, args.rtol)
    print(f"{'step':>5}  {labels[0]:>14}  {labels[1]:>14}  {'rel diff':>9}")
    for step, la, lb, rel, ok in rows:
        fa = f"{la:.7f}" if la is not None else "-"
        fb = f"{lb:.7f}" if lb is not None else "-"
        fr = f"{rel:.2e}" if rel is not None else "-"
        print(f"{step:>5}  {fa:>14}  {fb:>14}  {fr:>9}{'' if ok else '  <-'}")
    if args.png:
        plot(a, b, labels, args.png)
        print(f"wrote {args.png}")
    if args.assert_equal:
        if not rows:
            print("FAIL: no steps to compare" + (f" in --steps {args.steps}" if args.steps else ""))
            return 1
        if problems:
            what = "bitwise" if args.rtol == 0 else f"within rtol {args.rtol}"
            print(
                f"FAIL: losses not equal {what}: {problems[0]}"
                + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else "")
            )
            return 1
        print(
            f"OK: {len(rows)} steps equal"
            + (" bitwise" if args.rtol == 0 else f" within rtol {args.rtol}")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
