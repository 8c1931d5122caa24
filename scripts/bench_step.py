#!/usr/bin/env python3
"""Median step time of the same model, batch and layout under: a minimal hand-written
`fully_shard` loop, our trainer with FSDP2, and our trainer with SimpleFSDP, each eager and
compiled. Prints one table with each row's ratio to the hand-written loop of the same mode.

    python scripts/bench_step.py --ngpu 2                   # debug Llama3, 12 steps per row
    python scripts/bench_step.py --ngpu 2 --no-compile      # eager rows only
    python scripts/bench_step.py --ngpu 2 -- --training.seq_len=128   # overrides for the trainer rows

Every row runs as its own torchrun job on the same number of ranks and threads per rank,
fp32, the same global batch and sequence length; the first `--warmup` steps (compilation,
allocator warm-up) are left out of the median. The hand-written loop is the yardstick: the
same model class, one fully_shard per block plus the root, AdamW, gradient clipping, random
tokens (no data pipeline, no logging, no metrics).
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


def worker(args) -> None:
    """One rank of the hand-written loop (run under torchrun by `handwritten`)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    sys.path.insert(0, ROOT)
    from torchtitan.data.tokenizer import Tokenizer
    from torchtitan.models.flavors import model_args
    from torchtitan.models.train_spec import get_train_spec

    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",))
    spec = get_train_spec("llama3")
    vocab = Tokenizer("").vocab_size
    with torch.device("meta"):
        model = spec.model_cls(model_args("llama3", args.flavor, vocab, args.seq_len))
    for name, block in list(model.layers.items()):
        if args.compile:
            block = torch.compile(block, fullgraph=True)
            model.layers[name] = block
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device="cpu")
    model.init_weights(0, torch.device("cpu"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=False, foreach=True)
    gen = torch.Generator().manual_seed(rank)
    times = []
    for _ in range(args.steps):
        tokens = torch.randint(0, vocab, (args.local_batch_size, args.seq_len + 1), generator=gen)
        start = time.perf_counter()
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        dist.barrier()
        times.append(time.perf_counter() - start)
    if rank == 0:
        print("STEP_TIMES " + json.dumps(times), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def _env(ngpu: int) -> dict:
    threads = max(1, (os.cpu_count() or 1) // ngpu)
    return {**os.environ, "NGPU": str(ngpu), "OMP_NUM_THREADS": str(threads), "PYTHONPATH": ROOT}


def handwritten(args, compile_: bool) -> list[float]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.ngpu}",
           os.path.abspath(__file__), "--worker", f"--steps={args.steps}", f"--flavor={args.flavor}",
           f"--seq-len={args.seq_len}", f"--local-batch-size={args.local_batch_size}"] + (["--compile"] if compile_ else [])
    proc = subprocess.run(cmd, env=_env(args.ngpu), capture_output=True, text=True)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("STEP_TIMES ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"hand-written loop failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    return json.loads(line.split(" ", 1)[1])


def trainer(args, impl: str, compile_: bool, out: str) -> list[float]:
    dump = os.path.join(out, f"{impl}_{'compiled' if compile_ else 'eager'}")
    cmd = [os.path.join(ROOT, "run_train.sh"), f"--model.flavor={args.flavor}", f"--training.steps={args.steps}",
           f"--training.seq_len={args.seq_len}", f"--training.local_batch_size={args.local_batch_size}",
           "--training.mixed_precision_param=float32", "--metrics.enable_tensorboard=false",
           f"--parallelism.fsdp_implementation={impl}", f"--compile.enable={str(compile_).lower()}",
           f"--job.dump_folder={dump}", *args.extra]
    proc = subprocess.run(cmd, env=_env(args.ngpu), capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{impl} run failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    with open(os.path.join(dump, "metrics.jsonl")) as f:
        return [json.loads(line)["step_time"] for line in f if line.strip()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ngpu", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3, help="first steps left out of the median")
    ap.add_argument("--flavor", default="debugmodel")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--local-batch-size", type=int, default=4)
    ap.add_argument("--no-compile", action="store_true", help="eager rows only")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--compile", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("extra", nargs="*", help="config overrides for the trainer rows (after --)")
    args = ap.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    if args.steps <= args.warmup:
        print(f"error: --steps={args.steps} must exceed --warmup={args.warmup}", file=sys.stderr)
        return 2
    out = tempfile.mkdtemp(prefix="bench_step_")
    modes = [False] if args.no_compile else [False, True]
    import platform

    import torch

    print(f"{time.strftime('%Y-%m-%d')}, torch {torch.__version__}, {platform.machine()} {os.cpu_count()} cores;"
          f" {args.flavor} Llama3, {args.ngpu} ranks x {max(1, (os.cpu_count() or 1) // args.ngpu)} threads,"
          f" {args.local_batch_size} x {args.seq_len} tokens per rank, fp32; median of steps"
          f" {args.warmup + 1}-{args.steps}" + (f"; trainer overrides {' '.join(args.extra)}" if args.extra else ""))
    print(f"{'variant':34s} {'median s':>9s} {'vs hand-written':>15s} {'vs FSDP2':>9s}")
    for compile_ in modes:
        mode = "compiled" if compile_ else "eager"
        base = statistics.median(handwritten(args, compile_)[args.warmup:])
        print(f"{'hand-written fully_shard, ' + mode:34s} {base:>9.3f} {1.0:>14.2f}x", flush=True)
        fsdp2 = None
        for impl in ("fsdp2", "simple_fsdp"):
            median = statistics.median(trainer(args, impl, compile_, out)[args.warmup:])
            vs = "" if fsdp2 is None else f"{median / fsdp2:>8.2f}x"
            print(f"{'trainer ' + impl + ', ' + mode:34s} {median:>9.3f} {median / base:>14.2f}x {vs:>9s}", flush=True)
            fsdp2 = median if fsdp2 is None else fsdp2
    return 0


if __name__ == "__main__":
    sys.exit(main())
