#!/usr/bin/env python3
"""Multi-token prediction: `loss` and `mtp_loss` per step of DeepSeek-V3 tiny with
--model.mtp_depth=1 in multi-rank layouts vs 1 rank (the suite's settings, run_tests.BASE).

    PYTHONPATH=$PWD .venv/bin/python tests/integration/mtp_parity.py [--steps 4] [layout ...]

Prints one table row per (layout, step): loss, mtp_loss and their relative differences
from the 1-rank run; exits 1 when a difference exceeds --rtol (the suite's fp32 1e-4).
"""

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_tests  # noqa: E402

MTP = ["--model.mtp_depth=1"]
EP, TP = "--parallelism.expert_parallel_degree=2", "--parallelism.tensor_parallel_degree=2"
LAYOUTS = {  # name -> (ranks, overrides)
    "fsdp2+ep2": (2, [EP, "--training.local_batch_size=2"]),
    "tp2+ep2": (2, [TP, EP, "--training.local_batch_size=4"]),
    "simple_fsdp+tp2+ep2": (4, [TP, EP, "--parallelism.fsdp_implementation=simple_fsdp",
                                "--training.local_batch_size=2"]),
    "cp2+ep2": (2, ["--parallelism.context_parallel_degree=2", EP, "--training.local_batch_size=4"]),
    "fsdp2+ep2_ac_op_compile": (2, [EP, "--activation_checkpoint.mode=selective", "--compile.enable=true",
                                    "--training.local_batch_size=2"]),
}


def losses(ngpu: int, overrides: list[str], dump: str) -> tuple[list[float], list[float]]:
    rc, secs, out = run_tests.run(ngpu, [*MTP, *overrides], dump, model=run_tests.DS)
    if rc != 0:
        sys.exit(f"run failed ({ngpu} ranks, {' '.join(overrides)}):\n{out[-4000:]}")
    return run_tests.read_losses(dump), run_tests.read_losses(dump, "mtp_loss")


def parity(layouts: list[str], steps: int, workdir: str) -> list[tuple]:
    """(layout, step, loss, mtp_loss, loss rel diff, mtp_loss rel diff) rows, the 1-rank run first."""
    common = [f"--training.steps={steps}"]
    ref_loss, ref_mtp = losses(1, [*common, "--training.local_batch_size=8"], os.path.join(workdir, "1rank"))
    rows = [("1 rank", s + 1, ref_loss[s], ref_mtp[s], 0.0, 0.0) for s in range(steps)]
    for name in layouts:
        ngpu, overrides = LAYOUTS[name]
        loss, mtp = losses(ngpu, [*common, *overrides], os.path.join(workdir, name))
        rows += [(name, s + 1, loss[s], mtp[s], abs(loss[s] - ref_loss[s]) / abs(ref_loss[s]),
                  abs(mtp[s] - ref_mtp[s]) / abs(ref_mtp[s])) for s in range(steps)]
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("layouts", nargs="*", default=["fsdp2+ep2", "tp2+ep2"], choices=[[], *LAYOUTS])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rtol", type=float, default=1e-4)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mtp_parity_") as workdir:
        rows = parity(args.layouts or ["fsdp2+ep2", "tp2+ep2"], args.steps, workdir)
    print("| layout | step | loss | mtp_loss | loss diff vs 1 rank (rel) | mtp_loss diff vs 1 rank (rel) |")
    print("|---|---|---|---|---|---|")
    for name, step, loss, mtp, dl, dm in rows:
        print(f"| {name} | {step} | {loss:.6f} | {mtp:.6f} | {dl:.1e} | {dm:.1e} |")
    worst = max(max(r[4], r[5]) for r in rows)
    print(f"largest relative difference {worst:.1e} (tolerance {args.rtol:g})")
    return 0 if worst <= args.rtol else 1


if __name__ == "__main__":
    sys.exit(main())
