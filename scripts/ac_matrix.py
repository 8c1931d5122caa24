#!/usr/bin/env python3
"""The FSDP x activation-checkpointing matrix: for each combination, backward all-gathers
per step by mesh dim, bytes held for backward (eager), and the final loss (rank 0).

    python scripts/ac_matrix.py --ngpu 4                      # dp_shard=4
    python scripts/ac_matrix.py --ngpu 4 -- --parallelism.tensor_parallel_degree=2
    python scripts/ac_matrix.py --ngpu 4 --compile            # a compiled row after each eager one

Rows: fsdp2 (fsdp_ac_policy auto only) and simple_fsdp (auto, save, recompute), for
reshard_after_forward never and auto, AC full / op / every 2nd layer.
"""

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from comm_matrix import run_case  # noqa: E402

AC = {
    "full": ["--activation_checkpoint.mode=full"],
    "op": [
        "--activation_checkpoint.mode=selective",
        "--activation_checkpoint.selective_ac_option=op",
    ],
    "layer2": [
        "--activation_checkpoint.mode=selective",
        "--activation_checkpoint.selective_ac_option=2",
    ],
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--ngpu", type=int, default=4)
    ap.add_argument(
        "--compile",
        action="store_true",
        help="add a compiled row after each eager one (every AC mode)",
    )
    ap.add_argument("--reshard", default="never,auto")
    ap.add_argument("--ac", default="full,op,layer2")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("extra", nargs="*", help="overrides for every run (after --)")
    args = ap.parse_args(argv)
    out = tempfile.mkdtemp(prefix="ac_matrix_")
    base = [
        "--model.flavor=tiny",
        f"--training.steps={args.steps}",
        "--training.seq_len=64",
        "--training.local_batch_size=2",
        "--training.mixed_precision_param=float32",
        "--training.deterministic=true",
        "--metrics.enable_tensorboard=false",
        *args.extra,
    ]
    rows = []
    for impl in ("fsdp2", "simple_fsdp"):
        for reshard in args.reshard.split(","):
            for ac in args.ac.split(","):
                for policy in ["auto"] if impl == "fsdp2" else ["auto", "save", "recompute"]:
                    modes = ["eager"] + (["compile"] if args.compile else [])
                    for mode in modes:
                        rows.append((impl, reshard, ac, policy, mode))
    print(
        f"{'impl':11s} {'reshard':7s} {'AC':6s} {'fsdp_ac':9s} {'mode':7s} {'bwd AG dp_shard':>15s}"
        f" {'bwd AG tp':>9s} {'held MiB':>8s}  loss@{args.steps}"
    )
    for i, (impl, reshard, ac, policy, mode) in enumerate(rows):
        overrides = (
            base
            + AC[ac]
            + [
                f"--parallelism.fsdp_implementation={impl}",
                f"--parallelism.reshard_after_forward={reshard}",
                f"--activation_checkpoint.fsdp_ac_policy={policy}",
            ]
        )
        if mode == "compile":
            overrides.append("--compile.enable=true")
        else:
            overrides.append("--metrics.held_for_backward=true")
        rec = run_case(args.ngpu, overrides, os.path.join(out, str(i)))
        held = rec.get("held_for_backward_bytes")
        print(
            f"{impl:11s} {reshard:7s} {ac:6s} {policy:9s} {mode:7s}"
            f" {rec['comm'].get('backward/all_gather/dp_shard', 0):>15d} {rec['comm'].get('backward/all_gather/tp', 0):>9d}"
            f" {'-' if held is None else f'{held / 2**20:.2f}':>8s}  {rec['loss']:.6f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
