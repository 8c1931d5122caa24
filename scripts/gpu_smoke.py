#!/usr/bin/env python3
"""The first minutes on a GPU: does a step run without a host sync, compiled, at what speed
and memory against the prediction?

    python scripts/gpu_smoke.py                       # 1 GPU, debug Llama3, bf16, compiled, 12 steps
    python scripts/gpu_smoke.py --flavor 1B -- --training.seq_len=4096 --training.local_batch_size=2
    torchrun --nproc_per_node=8 scripts/gpu_smoke.py --flavor 8B -- --parallelism.tensor_parallel_degree=2
    python scripts/gpu_smoke.py --device cpu          # the same wiring on CPU (no sync check there)
    python scripts/gpu_smoke.py --flavor 8B --float8 -- ...   # the float8 row: run it beside the
                                                      # same command without --float8 (bf16)

It trains a dense model (Llama3 by default; MoE's expert-parallel split sizes sync by design)
with --metrics.log_freq=LOG_FREQ and, from step 2 on (step 1 compiles and initialises),
runs every step that does not log, and what follows it up to the next step, under
`torch.cuda.set_sync_debug_mode("error")`: any host sync there (an `.item()`, a blocking
copy, a `synchronize`) raises with its stack. Then rank 0 prints one line per logged step
(tokens/s per device, MFU, peak memory) and the trainer's predicted vs measured peak, and
"gpu smoke: ok" when no step synced.
"""

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


FLOAT8 = [
    "--model.converters=quantize.linear.float8",
    "--quantize.linear.float8.filter_fqns=output",
    "--quantize.linear.float8.enable_fsdp_float8_all_gather=true",
    "--quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp=true",
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--config", default=os.path.join(ROOT, "train_configs", "llama3_debug.toml"))
    ap.add_argument("--flavor", default="debugmodel")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--log-freq", type=int, default=4)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--dump", default=os.path.join(ROOT, "outputs", "gpu_smoke"))
    ap.add_argument(
        "--float8",
        action="store_true",
        help="float8 linears (torchao tensorwise, FSDP2's float8 all-gather, precomputed"
        " scales, the output head kept in bf16): tokens/s and MFU against the bf16 run",
    )
    ap.add_argument("extra", nargs="*", help="config overrides (after --)")
    args = ap.parse_args(argv)

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "error: no CUDA device here; run it on a GPU machine (or --device cpu to check the wiring)",
            file=sys.stderr,
        )
        return 2
    from torchtitan.checks import load_config_or_exit
    from torchtitan.train import Trainer

    overrides = [
        f"--job.config_file={args.config}",
        f"--model.flavor={args.flavor}",
        f"--training.steps={args.steps}",
        f"--metrics.log_freq={args.log_freq}",
        f"--training.device={args.device}",
        "--training.mixed_precision_param=bfloat16",
        "--compile.enable=true",
        "--checkpoint.enable=false",
        "--metrics.enable_tensorboard=false",
        f"--job.dump_folder={args.dump}",
        *(FLOAT8 if args.float8 else []),
        *args.extra,
    ]
    if "RANK" not in os.environ:  # one process: a 1-rank job
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29573")
    cfg = load_config_or_exit(overrides, int(os.environ["WORLD_SIZE"]))
    trainer = Trainer(cfg)
    checked = _check_syncs(trainer, args.device == "cuda")
    trainer.train()
    if trainer.rank == 0:
        _report(cfg.job.dump_folder, checked, args.device == "cuda")
    from torchtitan.distributed.process_groups import shutdown_distributed

    shutdown_distributed()
    return 0


def _check_syncs(trainer, on_cuda: bool) -> list[int]:
    """From step 2 on, the steps that are no sync point run under sync debug mode "error",
    from their forward to the start of the next step's (its data, the preemption agreement
    and the between-step checks included). Returns the list it fills with those steps."""
    import torch

    checked: list[int] = []
    start = trainer.train_state.step
    train_step, between = trainer.train_step, trainer._between_steps

    def mode(value: str) -> None:
        if on_cuda:
            torch.cuda.set_sync_debug_mode(value)

    def checked_step(batches, step):
        quiet = step > start + 1 and not trainer._sync_point(step, start)
        if quiet:
            mode("error")
            checked.append(step)
        return train_step(batches, step)

    def checked_between(step, start_step):
        try:
            return between(step, start_step)
        finally:
            mode("default")  # the next step decides again

    trainer.train_step, trainer._between_steps = checked_step, checked_between
    return checked


def _report(dump: str, checked: list[int], on_cuda: bool) -> None:
    with open(os.path.join(dump, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if line.strip()]
    for r in (r for r in records if "loss" in r):
        mfu = "n/a" if r.get("mfu") is None else f"{r['mfu']:.1%}"
        peak = r.get("memory_peak_allocated_gib")
        print(
            f"gpu smoke: step {r['step']}: loss {r['loss']:.4f}, {r['tokens_per_sec_per_device']:,.0f} tokens/s"
            f" per device, MFU {mfu}, step {r['step_time']:.3f}s"
            + (f", peak allocated {peak:.2f} GiB" if peak is not None else ""),
            flush=True,
        )
    what = (
        f"steps {checked} ran without a host sync (sync debug mode 'error')"
        if on_cuda
        else f"wiring only: steps {checked} would be checked on CUDA"
    )
    print(
        f"gpu smoke: ok: {what}; the predicted vs measured peak is the trainer's '[torchtitan] memory' line",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
