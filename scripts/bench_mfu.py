#!/usr/bin/env python3
"""Tokens/s per device, MFU and peak memory of Llama3 flavors on the devices present.

    python scripts/bench_mfu.py --flavors 1B,3B --compile off,on --ac selective   # one GPU, bf16
    python scripts/bench_mfu.py --ngpu 8 --flavors 8B -- --parallelism.tensor_parallel_degree=2
    python scripts/bench_mfu.py --dry-run ...      # print the runs without starting them
    python scripts/bench_mfu.py --device cpu       # the debug model on CPU ranks (no MFU there)

Each row is one run_train.sh job, run one after another, of
--steps steps on the embedded corpus; the first --warmup steps (compilation, allocator
warm-up) are left out. Reported: the median tokens/s per device, MFU against the GPU's dense
bf16 peak (torchtitan/hardware.py; FLOPs per token as torchtitan and Megatron-LM
count them, see docs/metrics.md), and the largest per-step peak of allocated and reserved CUDA
memory (on CPU: resident set size). Overrides after `--` go to every run.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

AC = {
    "none": ["--activation_checkpoint.mode=none"],
    "selective": [
        "--activation_checkpoint.mode=selective",
        "--activation_checkpoint.selective_ac_option=op",
    ],
    "full": ["--activation_checkpoint.mode=full"],
}


def rows(args) -> list[dict]:
    out = []
    for flavor in args.flavors.split(","):
        for comp in args.compile.split(","):
            for ac in args.ac.split(","):
                out.append({"flavor": flavor, "compile": comp, "ac": ac})
    return out


def command(row: dict, args, dump: str) -> list[str]:
    return [
        os.path.join(ROOT, "run_train.sh"),
        "--model.name=llama3",
        f"--model.flavor={row['flavor']}",
        f"--training.device={args.device}",
        f"--training.steps={args.steps}",
        f"--training.seq_len={args.seq_len}",
        f"--training.local_batch_size={args.local_batch_size}",
        f"--training.mixed_precision_param={args.dtype}",
        f"--compile.enable={row['compile'] == 'on'}",
        *AC[row["ac"]],
        "--metrics.enable_tensorboard=false",
        "--checkpoint.enable=false",
        f"--job.dump_folder={dump}",
        *args.overrides,
    ]


def summarise(dump: str, warmup: int) -> dict:
    with open(os.path.join(dump, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if line.strip()]
    steps = [r for r in records if "loss" in r]
    timed = steps[warmup:] or steps
    mfu = [r["mfu"] for r in timed if r.get("mfu") is not None]
    mem = {
        k: max(r[k] for r in steps)
        for k in ("memory_peak_allocated_gib", "memory_peak_reserved_gib", "memory_rss_gib")
        if k in steps[0]
    }
    return {
        "tps": statistics.median(r["tokens_per_sec_per_device"] for r in timed),
        "mfu": statistics.median(mfu) if mfu else None,
        "mem": mem,
        "loss": steps[-1]["loss"],
    }


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    overrides = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--ngpu", type=int, default=1, help="ranks per run (default 1)")
    ap.add_argument(
        "--flavors", default="", help="comma-separated (default: 1B,3B on cuda, debugmodel on cpu)"
    )
    ap.add_argument("--compile", default="off,on", help="off, on or both (default)")
    ap.add_argument(
        "--ac",
        default="selective",
        help=f"comma-separated of {', '.join(AC)} (default selective: op SAC)",
    )
    ap.add_argument(
        "--dtype", default="", help="parameter dtype (default bfloat16 on cuda, float32 on cpu)"
    )
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5, help="leading steps left out of the medians")
    ap.add_argument("--seq_len", type=int, default=0, help="default 8192 on cuda, 256 on cpu")
    ap.add_argument("--local_batch_size", type=int, default=0, help="default 1 on cuda, 4 on cpu")
    ap.add_argument("--out", default="", help="folder for the runs (default: a temporary one)")
    ap.add_argument("--dry-run", action="store_true", help="print the runs, start none")
    args = ap.parse_args(argv)
    cuda = args.device == "cuda"
    args.flavors = args.flavors or ("1B,3B" if cuda else "debugmodel")
    args.dtype = args.dtype or ("bfloat16" if cuda else "float32")
    args.seq_len = args.seq_len or (8192 if cuda else 256)
    args.local_batch_size = args.local_batch_size or (1 if cuda else 4)
    args.overrides = overrides
    for key, values, allowed in (
        ("--compile", args.compile, ("off", "on")),
        ("--ac", args.ac, tuple(AC)),
    ):
        bad = [v for v in values.split(",") if v not in allowed]
        if bad:
            print(f"error: {key}: unknown {bad[0]!r}; use {', '.join(allowed)}", file=sys.stderr)
            return 2
    sys.path.insert(0, ROOT)
    from torchtitan.models.flavors import flavors_of

    unknown = [f for f in args.flavors.split(",") if f not in flavors_of("llama3")]
    if unknown:
        print(
            f"error: --flavors: unknown llama3 flavor {unknown[0]!r}; choose from {', '.join(flavors_of('llama3'))}",
            file=sys.stderr,
        )
        return 2
    if args.steps <= args.warmup:
        print(
            f"error: --steps={args.steps} leaves no step after --warmup={args.warmup}; raise --steps",
            file=sys.stderr,
        )
        return 2
    out = args.out or (
        "<temporary folder>" if args.dry_run else tempfile.mkdtemp(prefix="bench_mfu_")
    )
    env = {**os.environ, "NGPU": str(args.ngpu)}

    import torch  # only for the header

    gpu = torch.cuda.get_device_name(0) if cuda and torch.cuda.is_available() else ""
    print(
        f"{time.strftime('%Y-%m-%d')}, torch {torch.__version__}, {args.ngpu} x {gpu or args.device}, {args.dtype},"
        f" seq_len {args.seq_len}, local batch {args.local_batch_size}, median of steps {args.warmup + 1}-{args.steps}"
    )
    print(
        f"{'flavor':10s} {'compile':7s} {'AC':9s} {'tok/s/dev':>10s} {'MFU':>6s} {'peak mem GiB':>18s} {'loss':>8s}"
    )
    failures = 0
    for row in rows(args):
        dump = os.path.join(out, f"{row['flavor']}_{row['compile']}_{row['ac']}")
        cmd = command(row, args, dump)
        if args.dry_run:
            print(f"$ NGPU={args.ngpu} " + " ".join(cmd))
            continue
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            failures += 1
            err = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()][-3:]
            print(
                f"{row['flavor']:10s} {row['compile']:7s} {row['ac']:9s} FAILED (exit {proc.returncode}): "
                + " | ".join(err)
            )
            continue
        s = summarise(dump, args.warmup)
        m = s["mem"]
        mem = (
            f"{m['memory_peak_allocated_gib']:.1f} / {m['memory_peak_reserved_gib']:.1f}"
            if "memory_peak_allocated_gib" in m
            else f"rss {m.get('memory_rss_gib', 0):.2f}"
        )
        mfu = "n/a" if s["mfu"] is None else f"{s['mfu']:.1%}"
        print(
            f"{row['flavor']:10s} {row['compile']:7s} {row['ac']:9s} {s['tps']:>10,.0f} {mfu:>6s} {mem:>18s} {s['loss']:>8.3f}",
            flush=True,
        )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
