#!/usr/bin/env python3
"""Plot the loss curves of one or more runs into a PNG.

    python scripts/plot_loss.py outputs/a/metrics.jsonl outputs/b/metrics.jsonl --out loss.png

Each input is a metrics.jsonl written by the trainer (or the run's dump folder holding one);
the legend shows the path unless --labels is given. Runs with [validation] enabled also get
their held-out loss, dashed with markers in the same color ("<label> (validation)").
"""

import argparse
import json
import os
import sys


def read_losses(path: str, key: str = "loss") -> tuple[list[int], list[float]]:
    """(steps, values) of the records that have `key` (training records: loss; validation
    records: validation_loss)."""
    if os.path.isdir(path):
        path = os.path.join(path, "metrics.jsonl")
    steps, losses = [], []
    with open(path) as f:
        for line in f:
            if line.strip():
                rec = json.loads(line)
                if key in rec:
                    steps.append(rec["step"])
                    losses.append(rec[key])
    return steps, losses


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("metrics", nargs="+", help="metrics.jsonl files or dump folders")
    ap.add_argument("--out", default="loss.png", help="PNG to write (default loss.png)")
    ap.add_argument("--labels", help="comma-separated legend labels, one per input")
    ap.add_argument("--title", default="loss")
    args = ap.parse_args(argv)

    labels = args.labels.split(",") if args.labels else args.metrics
    if len(labels) != len(args.metrics):
        print(
            f"error: --labels has {len(labels)} entries for {len(args.metrics)} inputs",
            file=sys.stderr,
        )
        return 2
    for path in args.metrics:
        full = os.path.join(path, "metrics.jsonl") if os.path.isdir(path) else path
        if not os.path.isfile(full):
            print(
                f"error: metrics file '{full}' not found; pass a run's metrics.jsonl or dump folder",
                file=sys.stderr,
            )
            return 2

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    for path, label in zip(args.metrics, labels):
        steps, losses = read_losses(path)
        (line,) = ax.plot(steps, losses, label=label, linewidth=1.5)
        val_steps, val_losses = read_losses(path, "validation_loss")
        if val_steps:
            ax.plot(
                val_steps,
                val_losses,
                "--o",
                color=line.get_color(),
                markersize=4,
                linewidth=1.2,
                label=f"{label} (validation)",
            )
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(args.title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    fig.savefig(args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
