#!/usr/bin/env python3
"""Multi-token prediction: `loss` and `mtp_loss` per step of DeepSeek-V3 tiny with
--model.mtp_depth=1 in multi-rank layouts vs 1 rank (the suite's settings, parity_cases.BASE).

    PYTHONPATH=$PWD .venv/bin/python tests/integration/mtp_parity.py [--steps 4] [layout ...]

Prints one table row per (layout, step): loss, mtp_loss and their relative differences
from the 1-rank run; exits 1 when one of them, or the gradient norm's, exceeds --rtol (the
suite's fp32 tolerance for its DeepSeek-V3 cases, 1e-4). Layouts: LAYOUTS.
"""

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import parity_cases  # noqa: E402
import run_tests  # noqa: E402

MTP = ["--model.mtp_depth=1"]
EP, TP = "--parallelism.expert_parallel_degree=2", "--parallelism.tensor_parallel_degree=2"
PP = "--parallelism.pipeline_parallel_degree=2"
LAYOUTS = {  # name -> (ranks, overrides)
    "fsdp2+ep2": (2, [EP, "--training.local_batch_size=2"]),
    "tp2+ep2": (2, [TP, EP, "--training.local_batch_size=4"]),
    "simple_fsdp+tp2+ep2": (
        4,
        [TP, EP, "--parallelism.fsdp_implementation=simple_fsdp", "--training.local_batch_size=2"],
    ),
    "cp2+ep2": (
        2,
        ["--parallelism.context_parallel_degree=2", EP, "--training.local_batch_size=4"],
    ),
    "pp2_ZBVZeroBubble": (
        2,
        [
            PP,
            "--parallelism.pipeline_parallel_schedule=ZBVZeroBubble",
            "--training.local_batch_size=8",
        ],
    ),
    "pp2_DualPipeV+ep2": (
        4,
        [
            PP,
            EP,
            "--parallelism.pipeline_parallel_schedule=DualPipeV",
            "--training.local_batch_size=4",
        ],
    ),
    "pp2_1F1B+fsdp2": (
        4,
        [PP, "--parallelism.pipeline_parallel_schedule=1F1B", "--training.local_batch_size=4"],
    ),
    # compiled TP + EP with MTP: the first block's input is a strided slice of the embedding
    # (a second input layout for dynamo: symbolic shapes DTensor could not hash, before dynamic=False)
    "tp2+ep2_compile": (
        2,
        [
            TP,
            EP,
            "--compile.enable=true",
            "--compile.backend=aot_eager",
            "--training.local_batch_size=4",
        ],
    ),
    "fsdp2+ep2_ac_op_compile": (
        2,
        [
            EP,
            "--activation_checkpoint.mode=selective",
            "--compile.enable=true",
            "--training.local_batch_size=2",
        ],
    ),
}


class RunFailed(RuntimeError):
    pass


def metrics(ngpu: int, overrides: list[str], dump: str) -> dict[str, list[float]]:
    """Per-step loss, mtp_loss and grad_norm of one run."""
    rc, _, out = run_tests.run(ngpu, [*MTP, *overrides], dump, model=parity_cases.DS)
    if rc != 0:
        raise RunFailed(f"run failed ({ngpu} ranks, {' '.join(overrides)}):\n{out[-4000:]}")
    return {key: run_tests.read_losses(dump, key) for key in ("loss", "mtp_loss", "grad_norm")}


def rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


def parity(layouts: list[str], steps: int, workdir: str) -> list[tuple]:
    """(layout, step, loss, mtp_loss, loss rel diff, mtp_loss rel diff, grad_norm rel diff)
    rows, the 1-rank run first."""
    common = [f"--training.steps={steps}"]
    ref = metrics(1, [*common, "--training.local_batch_size=8"], os.path.join(workdir, "1rank"))
    rows = [
        ("1 rank", s + 1, ref["loss"][s], ref["mtp_loss"][s], 0.0, 0.0, 0.0) for s in range(steps)
    ]
    for name in layouts:
        ngpu, overrides = LAYOUTS[name]
        got = metrics(ngpu, [*common, *overrides], os.path.join(workdir, name))
        assert len(got["loss"]) == len(got["mtp_loss"]) == steps, got
        rows += [
            (
                name,
                s + 1,
                got["loss"][s],
                got["mtp_loss"][s],
                rel(got["loss"][s], ref["loss"][s]),
                rel(got["mtp_loss"][s], ref["mtp_loss"][s]),
                rel(got["grad_norm"][s], ref["grad_norm"][s]),
            )
            for s in range(steps)
        ]
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("layouts", nargs="*", default=["fsdp2+ep2", "tp2+ep2"], choices=[[], *LAYOUTS])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rtol", type=float, default=1e-4)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mtp_parity_") as workdir:
        try:
            rows = parity(args.layouts or ["fsdp2+ep2", "tp2+ep2"], args.steps, workdir)
        except RunFailed as e:
            print(e, file=sys.stderr)
            return 1
    print(
        "| layout | step | loss | mtp_loss | loss diff vs 1 rank (rel) | mtp_loss diff vs 1 rank (rel) |"
    )
    print("|---|---|---|---|---|---|")
    for name, step, loss, mtp, dl, dm, _ in rows:
        print(f"| {name} | {step} | {loss:.6f} | {mtp:.6f} | {dl:.1e} | {dm:.1e} |")
    worst = max(max(r[4:]) for r in rows)
    print(
        f"largest relative difference (loss, mtp_loss, grad_norm) {worst:.1e} (tolerance {args.rtol:g})"
    )
    return 0 if worst <= args.rtol else 1


if __name__ == "__main__":
    sys.exit(main())
