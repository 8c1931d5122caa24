#!/usr/bin/env python3
"""Peak memory per rank while weights are initialised, FSDP over N CPU ranks.

    python scripts/init_memory.py --ngpu 8 --flavor 1B            # row blocks (the trainer's way)
    python scripts/init_memory.py --ngpu 8 --flavor 1B --whole    # one draw of each whole tensor
    python scripts/init_memory.py --ngpu 8 --flavor 1B --dim 512 --layers 2   # a smaller 128K-vocabulary model

Each rank builds the flavor on meta and parallelizes it through the trainer's build path
(FSDP over all ranks), materialises its shards, then runs the model's init_weights. Reported per rank:
its shards' size and how much its peak resident memory grew during init (VmHWM; the
shards' pages are first touched by init, so growth = shards + the largest transient).
"""

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def peak_rss_kib() -> int:
    """This process's peak resident set (VmHWM). Not ru_maxrss: Linux keeps that across
    execve, so a child of a large process (pytest) would start from its parent's peak."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def worker(args) -> None:
    import dataclasses

    import torch
    import torch.distributed as dist

    sys.path.insert(0, ROOT)
    from torchtitan.checks import load_config
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.models.common import init
    from torchtitan.models.flavors import flavors_of
    from torchtitan.training.build import build_parts
    from torchtitan.training.planned_job import PlannedJob, model_on_meta

    if args.whole:
        init.CHUNK_ELEMENTS = 1 << 62
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    # the trainer's build path: FSDP over every rank, the default plan, fp32 parameters
    cfg, _ = load_config([f"--model.flavor={args.flavor}", "--training.device=cpu"], world)
    dims = ParallelDims.from_config(cfg, world)
    dims.build_mesh("cpu")
    flavor = flavors_of("llama3")[args.flavor]
    flavor = dataclasses.replace(
        flavor, dim=args.dim or flavor.dim, n_layers=args.layers or flavor.n_layers
    )
    meta = model_on_meta(cfg, flavor)
    (model,) = build_parts(PlannedJob(cfg, meta, dims, "cpu"), dims.pp_rank()).modules
    model.to_empty(device="cpu")
    shard_bytes = sum(p.to_local().numel() * 4 for p in model.parameters())
    largest = max(p.numel() * 4 for p in model.parameters())
    dist.barrier()
    before = peak_rss_kib()
    model.init_weights(0, torch.device("cpu"))
    grown = peak_rss_kib() - before
    rows = [None] * world
    dist.all_gather_object(rows, (rank, shard_bytes, grown * 1024, largest))
    if rank == 0:
        print(json.dumps(rows))
    dist.destroy_process_group()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--ngpu", type=int, default=8, help="CPU ranks (default 8)")
    ap.add_argument(
        "--flavor", default="1B", help="llama3 flavor with a fixed vocabulary (default 1B)"
    )
    ap.add_argument("--dim", type=int, default=0, help="override the flavor's model width")
    ap.add_argument("--layers", type=int, default=0, help="override the flavor's number of blocks")
    ap.add_argument(
        "--whole", action="store_true", help="draw every tensor whole (the former init)"
    )
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    sys.path.insert(0, ROOT)
    from torchtitan.models.flavors import flavors_of

    fixed = [f for f, a in flavors_of("llama3").items() if a.vocab_size]
    if args.flavor not in fixed:
        print(
            f"error: --flavor={args.flavor!r}: pick a llama3 flavor with a fixed vocabulary: {', '.join(fixed)}",
            file=sys.stderr,
        )
        return 2
    if args.ngpu < 1 or args.dim < 0 or args.layers < 0:
        print(
            "error: --ngpu must be >= 1, --dim and --layers >= 0 (0 = the flavor's)",
            file=sys.stderr,
        )
        return 2
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={args.ngpu}",
        os.path.abspath(__file__),
        "--worker",
        f"--flavor={args.flavor}",
        f"--dim={args.dim}",
        f"--layers={args.layers}",
    ] + (["--whole"] if args.whole else [])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stdout[-2000:] + proc.stderr[-3000:], file=sys.stderr)
        return 1
    rows = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("[")][-1])
    mib = 2**20
    shape = (
        f" (dim {args.dim or 'as flavor'}, {args.layers or 'all'} blocks)"
        if args.dim or args.layers
        else ""
    )
    print(
        f"llama3 {args.flavor}{shape}, FSDP over {args.ngpu} CPU ranks, init {'whole tensors' if args.whole else 'in row blocks'}"
        f" (largest tensor {rows[0][3] / mib:,.0f} MiB)"
    )
    print(f"{'rank':>4} {'shards MiB':>11} {'peak growth MiB':>16} {'growth - shards':>16}")
    for rank, shard, grown, _ in rows:
        print(
            f"{rank:>4} {shard / mib:>11,.0f} {grown / mib:>16,.0f} {(grown - shard) / mib:>16,.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
