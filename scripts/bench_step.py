#!/usr/bin/env python3
"""The framework's overhead: our trainer's step against a minimal hand-written loop on the
same model, batch, layout and activation checkpointing, eager and compiled, and the
trainer's own host time per step.

    python scripts/bench_step.py --ngpu 2                      # 5 interleaved rounds, FSDP2
    python scripts/bench_step.py --ngpu 2 --rounds 3 --no-compile
    python scripts/bench_step.py --ngpu 2 --ac full --simple-fsdp   # full AC both sides; + SimpleFSDP rows
    python scripts/bench_step.py --ngpu 2 -- --training.seq_len=128 # overrides for the trainer's runs

A round runs, per mode (eager, compiled), the hand-written loop and then the trainer, each as
its own torchrun job of `--steps` steps; a row's step time is the median over steps after
`--warmup` (compilation, allocator warm-up), timed on rank 0 from the start of one step to
the start of the next (everything a step costs: data, logging, checks). Rounds interleave
the rows, so a drift of the machine's speed hits every row alike; the ratio reported is the
median over rounds of each round's trainer / hand-written ratio.

The hand-written loop: the same model class, one `fully_shard` per block plus the root (and
`checkpoint_wrapper` per block with --ac full), random tokens, cross entropy, gradient
clipping, AdamW (foreach), zero_grad: no data pipeline, no metrics, no checks.

Framework host time: in the trainer's runs every step's time, minus the time inside the
model's forward/backward and loss (StepRunner.forward_backward), the gradient clipping and
the optimizer step (what the hand-written loop does too). The rest is the framework's own:
the data pipeline, the non-finite flag, the step clock, logging, the watchdog's progress
notes, the preemption agreement, the between-step checks. Goal: <= 1.05x and <= 2%.
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
LLAMA = os.path.join(ROOT, "train_configs", "llama3_debug.toml")


def handwritten_worker(args) -> None:
    """One rank of the hand-written loop (run under torchrun)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    sys.path.insert(0, ROOT)
    from torchtitan.data.tokenizer import Tokenizer
    from torchtitan.models.flavors import model_args
    from torchtitan.models.train_spec import get_train_spec

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("dp_shard",))
    vocab = Tokenizer("").vocab_size
    with torch.device("meta"):
        model = get_train_spec("llama3").model_cls(
            model_args("llama3", args.flavor, vocab, args.seq_len)
        )
    for name, block in list(model.layers.items()):
        if args.ac == "full":
            block = checkpoint_wrapper(block, preserve_rng_state=False)
        if args.compile:
            block = torch.compile(block, fullgraph=True)
        model.layers[name] = block
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device="cpu")
    model.init_weights(0, torch.device("cpu"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    gen = torch.Generator().manual_seed(rank)
    starts = []
    for _ in range(args.steps):
        starts.append(time.perf_counter())
        tokens = torch.randint(0, vocab, (args.local_batch_size, args.seq_len + 1), generator=gen)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    starts.append(time.perf_counter())
    if rank == 0:
        print(
            "STEPS " + json.dumps({"step_s": [b - a for a, b in zip(starts, starts[1:])]}),
            flush=True,
        )
    dist.barrier()
    dist.destroy_process_group()


def trainer_worker(argv: list[str]) -> None:
    """One rank of the trainer, its steps timed from the inside (run under torchrun)."""
    sys.path.insert(0, ROOT)
    import torch.distributed as dist

    import torchtitan.train as train
    from torchtitan.checks import load_config_or_exit

    trainer = train.Trainer(load_config_or_exit(argv, int(os.environ["WORLD_SIZE"])))
    starts, inside = [], []

    def timed(fn):
        def run(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                inside[-1] += time.perf_counter() - t0

        return run

    begin = trainer.clock.begin

    def step_begins():
        starts.append(time.perf_counter())
        inside.append(0.0)
        begin()

    trainer.clock.begin = step_begins
    trainer.runner.forward_backward = timed(trainer.runner.forward_backward)
    trainer.optimizers.step = timed(trainer.optimizers.step)
    train.clip_grad_norm_ = timed(train.clip_grad_norm_)
    trainer.train()
    starts.append(time.perf_counter())
    if dist.get_rank() == 0:
        step_s = [b - a for a, b in zip(starts, starts[1:])]
        print(
            "STEPS "
            + json.dumps(
                {"step_s": step_s, "framework_s": [s - i for s, i in zip(step_s, inside)]}
            ),
            flush=True,
        )
    train.shutdown_distributed()


def _env(ngpu: int) -> dict:
    threads = max(1, (os.cpu_count() or 1) // ngpu)
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": ROOT}


def _run(args, worker_args: list[str]) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={args.ngpu}",
        os.path.abspath(__file__),
        *worker_args,
    ]
    proc = subprocess.run(cmd, env=_env(args.ngpu), capture_output=True, text=True)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("STEPS ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(
            f"{' '.join(worker_args[:2])} failed (exit {proc.returncode}):\n"
            f"{(proc.stdout + proc.stderr)[-3000:]}"
        )
    return {k: v[args.warmup :] for k, v in json.loads(line.split(" ", 1)[1]).items()}


def handwritten(args, compile_: bool) -> dict:
    return _run(
        args,
        [
            "--handwritten-worker",
            f"--steps={args.steps}",
            f"--flavor={args.flavor}",
            f"--seq-len={args.seq_len}",
            f"--local-batch-size={args.local_batch_size}",
            f"--ac={args.ac}",
        ]
        + (["--compile"] if compile_ else []),
    )


def trainer(args, impl: str, compile_: bool, out: str) -> dict:
    ac = {"none": [], "full": ["--activation_checkpoint.mode=full"]}[args.ac]
    return _run(
        args,
        [
            "--trainer-worker",
            "--",
            f"--job.config_file={LLAMA}",
            f"--model.flavor={args.flavor}",
            f"--training.steps={args.steps}",
            f"--training.seq_len={args.seq_len}",
            f"--training.local_batch_size={args.local_batch_size}",
            f"--training.global_batch_size={args.local_batch_size * args.ngpu}",
            "--training.mixed_precision_param=float32",
            "--metrics.enable_tensorboard=false",
            f"--metrics.log_freq={args.log_freq}",
            "--checkpoint.enable=false",
            f"--parallelism.fsdp_implementation={impl}",
            f"--compile.enable={str(compile_).lower()}",
            f"--job.dump_folder={os.path.join(out, impl)}",
            *ac,
            *args.extra,
        ],
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--ngpu", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3, help="first steps left out of the median")
    ap.add_argument("--log-freq", type=int, default=10, help="the trainer's --metrics.log_freq")
    ap.add_argument("--flavor", default="debugmodel")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--local-batch-size", type=int, default=4)
    ap.add_argument("--ac", choices=("none", "full"), default="none")
    ap.add_argument("--no-compile", action="store_true", help="eager rows only")
    ap.add_argument("--simple-fsdp", action="store_true", help="SimpleFSDP trainer rows too")
    ap.add_argument("--handwritten-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--trainer-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--compile", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("extra", nargs="*", help="config overrides for the trainer's runs (after --)")
    args = ap.parse_args(argv)
    if args.handwritten_worker:
        handwritten_worker(args)
        return 0
    if args.trainer_worker:
        trainer_worker(args.extra)
        return 0
    if args.steps <= args.warmup:
        print(f"error: --steps={args.steps} must exceed --warmup={args.warmup}", file=sys.stderr)
        return 2
    import platform

    import torch

    out = tempfile.mkdtemp(prefix="bench_step_")
    modes = [False] if args.no_compile else [False, True]
    impls = ["fsdp2", "simple_fsdp"] if args.simple_fsdp else ["fsdp2"]
    print(
        f"{time.strftime('%Y-%m-%d')}, torch {torch.__version__}, {platform.machine()} {os.cpu_count()} cores;"
        f" {args.flavor} Llama3, {args.ngpu} ranks x {max(1, (os.cpu_count() or 1) // args.ngpu)} threads,"
        f" {args.local_batch_size} x {args.seq_len} tokens per rank, fp32, AC {args.ac}; median of steps"
        f" {args.warmup + 1}-{args.steps}, {args.rounds} interleaved rounds"
        + (f"; trainer overrides {' '.join(args.extra)}" if args.extra else ""),
        flush=True,
    )
    ratios = {(m, i): [] for m in modes for i in impls}
    shares = {(m, i): [] for m in modes for i in impls}
    for r in range(1, args.rounds + 1):
        for compile_ in modes:
            mode = "compiled" if compile_ else "eager"
            base = statistics.median(handwritten(args, compile_)["step_s"])
            line = f"round {r} {mode:8s} hand-written {base:.3f}s"
            for impl in impls:
                run = trainer(args, impl, compile_, out)
                step = statistics.median(run["step_s"])
                share = statistics.median(run["framework_s"]) / step
                ratios[(compile_, impl)].append(step / base)
                shares[(compile_, impl)].append(share)
                line += (
                    f" | {impl} {step:.3f}s = {step / base:.3f}x, framework host time {share:.1%}"
                )
            print(line, flush=True)
    print(
        f"{'trainer row':22s} {'vs hand-written (median of rounds)':>36s} {'framework host time':>20s}  rounds"
    )
    for (compile_, impl), values in ratios.items():
        name = f"{impl}, {'compiled' if compile_ else 'eager'}"
        print(
            f"{name:22s} {statistics.median(values):>35.3f}x {statistics.median(shares[(compile_, impl)]):>19.1%}"
            f"  {', '.join(f'{v:.3f}' for v in values)}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
