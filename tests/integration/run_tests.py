#!/usr/bin/env python3
"""The multi-rank suite: named run_train.sh cases, each checked against a 1-rank reference.

    python tests/integration/run_tests.py --ngpu 8                # every case of <= 8 ranks, on CPU
    python tests/integration/run_tests.py --ngpu 4 --filter pp    # cases whose name contains "pp"
    python tests/integration/run_tests.py --device cuda --ngpu 8  # on GPUs, one per rank (NCCL)
    python tests/integration/run_tests.py --launcher torchrun     # every run through run_train.sh

Runs are pinned to a device: CPU ranks (gloo) unless --device cuda, which skips, with the
reason, every case needing more ranks than the GPUs present. Every case trains the tiny
Llama3 (or DeepSeek-V3, cases named deepseek_*) for 10 steps with the same global batch as
its 1-rank reference of the same model and dtype (fp32, or bf16 for cases named bf16_*), and
passes when it exits 0 within --timeout seconds and every step's loss and gradient norm are
within the case's tolerance (relative) of the reference's (the table shows the largest
difference of each). A failing case shows every rank's last lines. Runs get run_train.sh's
argv and environment; on CPU their ranks are forked from one process that imported torchtitan
once (fast_launch.py) unless --launcher torchrun (or TITAN_TEST_LAUNCHER=torchrun).
"""

import argparse
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

if os.path.dirname(os.path.abspath(__file__)) not in sys.path:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fast_launch  # noqa: E402

from torchtitan.distributed.pipeline_layout import ZERO_BUBBLE  # noqa: E402  (torch-free)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN_TRAIN = os.path.join(ROOT, "run_train.sh")

GLOBAL_BATCH = 8
STEPS = 10
# Shared by every case and the reference: tiny model, fp32, deterministic, no TensorBoard.
BASE = [
    "--model.flavor=tiny",
    f"--training.steps={STEPS}",
    "--training.seq_len=64",
    "--training.local_batch_size=2",
    f"--training.global_batch_size={GLOBAL_BATCH}",
    "--training.deterministic=true",
    "--training.mixed_precision_param=float32",
    "--training.mixed_precision_reduce=float32",
    "--metrics.enable_tensorboard=false",
    "--lr_scheduler.warmup_steps=2",
    "--optimizer.lr=3e-3",
    # no start-up memory prediction (a child process per run): tested by test_memory_budget.py
    "--planning.memory_budget_gib=none",
]


@dataclass
class Case:
    name: str
    ngpu: int
    overrides: list[str] = field(default_factory=list)
    slow: bool = False  # only with --slow (kept out of `make test`)
    model: str = "llama3"  # each (model, dtype) has its own 1-rank reference
    dtype: str = "float32"  # parameter dtype (bfloat16: bf16 compute, fp32 gradient reduction)
    rtol: float = 1e-4  # largest relative loss / gradient-norm difference from the reference (fp32)
    attn_mask: str = "causal"  # block_causal: against a block-causal 1-rank reference
    launcher: str | None = (
        None  # None: launcher_name()'s choice ("fast" unless TITAN_TEST_LAUNCHER says)
    )


# bf16 vs a bf16 1-rank reference: the same math in another order (sharded reductions, other
# matmul splits) rounds differently in bf16's 8-bit mantissa. Measured on CPU over 10 steps
# (README): at most 1.5e-5 (loss) and 6.8e-5 (gradient norm); CPU matmuls accumulate bf16
# products in fp32. GPU kernels split and accumulate differently: a looser bound there.
BF16_RTOL = {"cpu": 1e-3, "cuda": 2e-2}
BF16 = "bfloat16"


def tolerance(case: "Case") -> float:
    return BF16_RTOL[DEVICE] if case.dtype == BF16 else case.rtol


def reference_name(model: str, dtype: str, attn_mask: str = "causal") -> str:
    return (
        "reference"
        + ("" if model == "llama3" else f"_{model}")
        + ("" if dtype == "float32" else "_bf16")
        + ("" if attn_mask == "causal" else f"_{attn_mask}")
    )


DS = "deepseek_v3"
# Qwen3 (tiny: QK-norm, head_dim 32 != dim / heads, tied embeddings) and its MoE flavor
# (tiny_moe: 1 dense + 3 MoE blocks, 8 experts, top 2, the Switch-style balance loss)
QWEN, QWEN_MOE, QWEN_MOE_NOAUX = "qwen3", "qwen3_moe", "qwen3_moe_noaux"
# a case's model -> (model name, flavor, overrides); default: (model, "tiny", none). Each has
# its own 1-rank reference (without the balance loss: TP, where it is refused)
MODELS = {
    QWEN_MOE: ("qwen3", "tiny_moe", []),
    QWEN_MOE_NOAUX: ("qwen3", "tiny_moe", ["--moe.aux_loss_coeff=0"]),
}
MB2 = "--parallelism.pipeline_parallel_microbatch_size=2"
EP = "--parallelism.expert_parallel_degree=2"
COMM = "--metrics.comm_stats=true"


PP = "--parallelism.pipeline_parallel_degree=2"
TP = "--parallelism.tensor_parallel_degree=2"
CP2 = "--parallelism.context_parallel_degree=2"
BLOCK_CAUSAL = "--model.attn_mask=block_causal"


def _schedule(name: str) -> str:
    return f"--parallelism.pipeline_parallel_schedule={name}"


CASES = [
    # bf16 parameters and activations, fp32 gradient reduction (the CUDA default), each against
    # a bf16 1-rank reference: FSDP2's and SimpleFSDP's casts, bf16 activations between stages
    Case("bf16_fsdp", 2, dtype=BF16),
    Case("bf16_simple_fsdp", 2, ["--parallelism.fsdp_implementation=simple_fsdp"], dtype=BF16),
    Case(
        "bf16_pp",
        2,
        [
            "--parallelism.pipeline_parallel_degree=2",
            "--parallelism.pipeline_parallel_microbatch_size=1",
        ],
        dtype=BF16,
    ),
    # data parallel
    Case(
        "fsdp", 4, slow=True
    ),  # the same run is test_checkpoint.py's fsdp straight run, checked vs 1 rank
    # through run_train.sh and torchrun whatever the default launcher: its losses must equal, bitwise,
    # those of the AC cases below (test_parity_suite.py), which the fast launcher runs
    Case("fsdp_2", 2, launcher="torchrun"),
    Case(
        "fsdp_8", 8, ["--training.local_batch_size=1"], slow=True
    ),  # 8 ranks: pp+fsdp+tp covers it
    Case(
        "hsdp",
        4,
        [
            "--parallelism.data_parallel_replicate_degree=2",
            "--parallelism.data_parallel_shard_degree=2",
        ],
    ),
    Case(
        "ddp",
        2,
        [
            "--parallelism.data_parallel_replicate_degree=2",
            "--parallelism.data_parallel_shard_degree=1",
        ],
    ),
    Case("grad_accum", 2, ["--training.local_batch_size=1"]),
    # tensor parallel
    Case(
        "tp", 2, [TP, "--training.local_batch_size=8"], slow=True
    ),  # TP in make test: fsdp+tp (test_checkpoint)
    Case(
        "tp_no_loss_parallel",
        2,
        [TP, "--training.local_batch_size=8", "--parallelism.loss_parallel=false"],
        slow=True,
    ),
    # (fsdp+tp and pp+fsdp_Interleaved1F1B are also checked against 1 rank by test_checkpoint.py)
    Case("fsdp+tp", 4, [TP, "--training.local_batch_size=4"], slow=True),
    Case("hsdp+tp", 8, [TP, "--parallelism.data_parallel_replicate_degree=2"], slow=True),
    # pipeline parallel: every schedule alone (2 ranks) and with FSDP (4 ranks)
    # (alone, only 1F1B and DualPipeV run in `make test`: every schedule also runs with FSDP below)
    *[
        Case(
            f"pp_{name}",
            2,
            [PP, _schedule(name), "--training.local_batch_size=8"],
            slow=name not in ("1F1B", "DualPipeV"),
        )
        for name in (
            "GPipe",
            "1F1B",
            "Interleaved1F1B",
            "LoopedBFS",
            "InterleavedZeroBubble",
            "ZBVZeroBubble",
            "DualPipeV",
        )
    ],
    # (GPipe and LoopedBFS with FSDP only with --slow: FSDP2 sees them as 1F1B / Interleaved1F1B do;
    # 1F1B with FSDP too: pp_1F1B and bf16_pp run it alone, test_checkpoint.py's pp+fsdp with FSDP)
    *[
        Case(
            f"pp+fsdp_{name}",
            4,
            [PP, _schedule(name), "--training.local_batch_size=4"],
            slow=name in ("Interleaved1F1B", "GPipe", "LoopedBFS", "1F1B"),
        )
        for name in (
            "GPipe",
            "1F1B",
            "Interleaved1F1B",
            "LoopedBFS",
            "InterleavedZeroBubble",
            "ZBVZeroBubble",
            "DualPipeV",
        )
    ],
    Case(
        "pp+fsdp+tp",
        8,
        [PP, TP, _schedule("Interleaved1F1B"), "--training.local_batch_size=4"],
        slow=True,
    ),
    Case(
        "pp_split_points",
        2,
        [
            PP,
            "--parallelism.pipeline_parallel_split_points=layers.1",
            "--training.local_batch_size=8",
        ],
        slow=True,
    ),
    # SimpleFSDP: FSDP, with TP, HSDP, DDP and PP
    Case("simple_fsdp", 2, ["--parallelism.fsdp_implementation=simple_fsdp"]),
    # (in `make test` SimpleFSDP + TP is compared with FSDP2 + TP by test_simple_fsdp_ac.py)
    Case(
        "simple_fsdp+tp",
        4,
        ["--parallelism.fsdp_implementation=simple_fsdp", TP, "--training.local_batch_size=4"],
        slow=True,
    ),
    Case(
        "simple_hsdp",
        4,
        [
            "--parallelism.fsdp_implementation=simple_fsdp",
            "--parallelism.data_parallel_replicate_degree=2",
        ],
        slow=True,
    ),
    Case(
        "simple_ddp",
        2,
        [
            "--parallelism.fsdp_implementation=simple_fsdp",
            "--parallelism.data_parallel_replicate_degree=2",
            "--parallelism.data_parallel_shard_degree=1",
        ],
        slow=True,
    ),
    Case(
        "simple_fsdp+pp",
        4,
        ["--parallelism.fsdp_implementation=simple_fsdp", PP, "--training.local_batch_size=4"],
        slow=True,
    ),
    Case(
        "simple_fsdp_op_sac_compile",
        2,
        [
            "--parallelism.fsdp_implementation=simple_fsdp",
            "--compile.enable=true",
            "--activation_checkpoint.mode=selective",
        ],
        slow=True,
    ),
    # TP hands compiled blocks async-collective tensors; SimpleFSDP's pre-hook settles them
    Case(
        "simple_fsdp+tp_compile_ac_full",
        4,
        [
            "--parallelism.fsdp_implementation=simple_fsdp",
            TP,
            "--compile.enable=true",
            "--activation_checkpoint.mode=full",
            "--training.local_batch_size=4",
        ],
        slow=True,
    ),
    # activation checkpointing and compile (with FSDP)
    Case("fsdp_ac_full", 2, ["--activation_checkpoint.mode=full"]),
    Case(
        "fsdp_ac_op",
        2,
        [
            "--activation_checkpoint.mode=selective",
            "--activation_checkpoint.selective_ac_option=op",
        ],
    ),
    Case(
        "fsdp_ac_layer",
        2,
        ["--activation_checkpoint.mode=selective", "--activation_checkpoint.selective_ac_option=2"],
    ),
    Case("fsdp_compile", 2, ["--compile.enable=true"]),
    Case(
        "fsdp_compile_ac_op",
        2,
        ["--compile.enable=true", "--activation_checkpoint.mode=selective"],
        slow=True,
    ),
    # DeepSeek-V3 (tiny: MLA, 1 dense + 3 MoE blocks, 8 experts, group-limited top 2) with EP
    # context parallel: each rank holds 2 of 2 x CP chunks of every sequence (global batch 8)
    Case("cp2", 2, [CP2, "--training.local_batch_size=8"]),
    Case("cp2+fsdp", 4, [CP2, "--training.local_batch_size=4"]),
    Case("cp2+tp", 4, [CP2, TP, "--training.local_batch_size=8"], slow=True),
    Case("pp+cp2", 4, [PP, CP2, "--training.local_batch_size=8"], slow=True),
    Case(
        "cp4+fsdp",
        8,
        ["--parallelism.context_parallel_degree=4", "--training.local_batch_size=4"],
        slow=True,
    ),
    Case(
        "simple_fsdp+cp2_op_sac",
        2,
        [
            "--parallelism.fsdp_implementation=simple_fsdp",
            CP2,
            "--activation_checkpoint.mode=selective",
            "--training.local_batch_size=8",
        ],
        slow=True,
    ),
    Case(
        "block_causal_cp2",
        2,
        [BLOCK_CAUSAL, CP2, "--training.local_batch_size=8"],
        attn_mask="block_causal",
    ),
    Case(
        "pp+block_causal_cp2",
        4,
        [PP, BLOCK_CAUSAL, CP2, "--training.local_batch_size=8"],
        attn_mask="block_causal",
        slow=True,
    ),  # document ids reach every stage with the microbatch
    Case(
        "cp2_compile_ac_op",
        2,
        [
            CP2,
            "--compile.enable=true",
            "--activation_checkpoint.mode=selective",
            "--training.local_batch_size=8",
        ],
        slow=True,
    ),
    Case(
        "cp2+fsdp_ac_full_grad_accum",
        4,
        [CP2, "--activation_checkpoint.mode=full", "--training.local_batch_size=2"],
        slow=True,
    ),
    Case(
        "simple_fsdp+cp2+hsdp",
        8,
        [
            "--parallelism.fsdp_implementation=simple_fsdp",
            CP2,
            "--parallelism.data_parallel_replicate_degree=2",
            "--training.local_batch_size=2",
        ],
        slow=True,
    ),
    Case("deepseek_cp2+ep", 4, [CP2, EP, "--training.local_batch_size=4"], model=DS, slow=True),
    Case("deepseek_pp+cp2", 4, [PP, CP2, "--training.local_batch_size=8"], model=DS, slow=True),
    Case(
        "deepseek_cp2+tp+ep4",
        4,
        [CP2, TP, "--parallelism.expert_parallel_degree=4", "--training.local_batch_size=8"],
        model=DS,
        slow=True,
    ),
    Case(
        "deepseek_cp2+ep_compile",
        4,
        [CP2, EP, "--compile.enable=true", "--training.local_batch_size=4"],
        model=DS,
        slow=True,
    ),
    Case("deepseek_fsdp", 2, [], model=DS, slow=True),
    Case(
        "deepseek_ddp",
        2,
        [
            "--parallelism.data_parallel_replicate_degree=2",  # experts replicated first
            "--parallelism.data_parallel_shard_degree=1",
        ],
        model=DS,
    ),
    # (comm stats on: test_parity_suite.py also asserts the EP all-to-all counts of these three)
    Case("deepseek_ep_all_of_dp_shard", 2, [EP, COMM], model=DS),  # experts' FSDP mesh of size 1
    Case("deepseek_fsdp+ep", 4, [EP, "--training.local_batch_size=2"], model=DS, slow=True),
    # (TP + EP in make test: test_gradients.py compares its gradients tensor by tensor)
    Case("deepseek_fsdp+tp+ep", 4, [TP, EP, "--training.local_batch_size=4"], model=DS, slow=True),
    Case(
        "deepseek_hsdp+ep",
        4,
        [EP, "--parallelism.data_parallel_replicate_degree=2"],
        model=DS,
        slow=True,
    ),
    # stage 0 = embeddings + the dense block: a pipeline rank with no MoE layer joins the balancing
    Case(
        "deepseek_pp+fsdp+ep",
        4,
        [
            PP,
            EP,
            "--training.local_batch_size=4",
            "--parallelism.pipeline_parallel_split_points=layers.1",
        ],
        model=DS,
    ),
    Case(
        "deepseek_pp+ep_grad_accum",
        4,
        [PP, EP, "--training.local_batch_size=2"],
        model=DS,
        slow=True,
    ),
    Case(
        "deepseek_pp+fsdp+tp+ep",
        8,
        [PP, TP, EP, "--training.local_batch_size=4", _schedule("Interleaved1F1B")],
        model=DS,
        slow=True,
    ),
    Case(
        "deepseek_pp+fsdp+ep_always_ac_op",
        4,
        [
            PP,
            EP,
            "--activation_checkpoint.mode=selective",
            "--parallelism.reshard_after_forward=always",
            "--training.local_batch_size=4",
        ],
        model=DS,
        slow=True,
    ),
    Case("deepseek_ep_grad_accum", 2, [EP, "--training.local_batch_size=1"], model=DS, slow=True),
    Case("deepseek_ep_ac_full", 2, [EP, COMM, "--activation_checkpoint.mode=full"], model=DS),
    Case("deepseek_ep_ac_op", 2, [EP, COMM, "--activation_checkpoint.mode=selective"], model=DS),
    # SimpleFSDP + EP, experts' gathers on their own group (size 2): with reshard never and op
    # SAC no FSDP gather (dense or experts) runs in backward (test_parity_suite.py)
    Case(
        "deepseek_simple_fsdp+ep_op_sac",
        4,
        [
            EP,
            COMM,
            "--parallelism.fsdp_implementation=simple_fsdp",
            "--parallelism.reshard_after_forward=never",
            "--activation_checkpoint.mode=selective",
            "--training.local_batch_size=2",
        ],
        model=DS,
    ),
    Case(
        "deepseek_ep_compile", 2, [EP, "--compile.enable=true"], model=DS, slow=True
    ),  # MoE dispatch eager
    Case(
        "deepseek_simple_fsdp+tp+ep",
        4,
        [TP, EP, "--parallelism.fsdp_implementation=simple_fsdp", "--training.local_batch_size=4"],
        model=DS,
        slow=True,
    ),
    # Qwen3 dense: the tied embedding is one parameter of the root unit (FSDP2, SimpleFSDP, TP),
    # or under PP two copies whose gradients are summed between the first and last stage
    Case("qwen3_fsdp", 2, [], model=QWEN),
    Case(
        "qwen3_simple_fsdp",
        2,
        ["--parallelism.fsdp_implementation=simple_fsdp"],
        model=QWEN,
        slow=True,
    ),
    Case("qwen3_tp", 2, [TP, "--training.local_batch_size=8"], model=QWEN),
    Case("qwen3_pp", 2, [PP, "--training.local_batch_size=8"], model=QWEN),
    # every schedule (V schedules: both tied copies on pipeline rank 0, summed locally)
    *[
        Case(
            f"qwen3_pp_{name}",
            2,
            [PP, _schedule(name), "--training.local_batch_size=8"],
            model=QWEN,
            slow=True,
        )
        for name in (
            "GPipe",
            "Interleaved1F1B",
            "LoopedBFS",
            "InterleavedZeroBubble",
            "ZBVZeroBubble",
            "DualPipeV",
        )
    ],
    Case(
        "qwen3_pp+fsdp+tp", 8, [PP, TP, "--training.local_batch_size=4"], model=QWEN, slow=True
    ),  # TP-split copies
    Case("qwen3_fsdp_ac_full", 2, ["--activation_checkpoint.mode=full"], model=QWEN, slow=True),
    Case(
        "qwen3_simple_fsdp_op_sac_compile",
        2,
        [
            "--parallelism.fsdp_implementation=simple_fsdp",
            "--compile.enable=true",
            "--activation_checkpoint.mode=selective",
        ],
        model=QWEN,
        slow=True,
    ),
    Case(
        "qwen3_pp4",
        4,
        ["--parallelism.pipeline_parallel_degree=4", "--training.local_batch_size=8"],
        model=QWEN,
        slow=True,
    ),  # copies on ranks 0 and 3: their own group
    Case("qwen3_cp2", 2, [CP2, "--training.local_batch_size=8"], model=QWEN),
    Case(
        "qwen3_block_causal_cp2",
        2,
        [BLOCK_CAUSAL, CP2, "--training.local_batch_size=8"],
        model=QWEN,
        attn_mask="block_causal",
        slow=True,
    ),
    Case(
        "qwen3_ddp",
        2,
        [
            "--parallelism.data_parallel_replicate_degree=2",
            "--parallelism.data_parallel_shard_degree=1",
        ],
        model=QWEN,
        slow=True,
    ),
    Case(
        "qwen3_hsdp", 4, ["--parallelism.data_parallel_replicate_degree=2"], model=QWEN, slow=True
    ),
    Case("qwen3_fsdp+tp", 4, [TP, "--training.local_batch_size=4"], model=QWEN, slow=True),
    Case(
        "qwen3_simple_fsdp+tp",
        4,
        ["--parallelism.fsdp_implementation=simple_fsdp", TP, "--training.local_batch_size=4"],
        model=QWEN,
        slow=True,
    ),
    Case(
        "qwen3_simple_fsdp+pp",
        4,
        ["--parallelism.fsdp_implementation=simple_fsdp", PP, "--training.local_batch_size=4"],
        model=QWEN,
        slow=True,
    ),
    Case(
        "qwen3_fsdp_compile", 2, ["--compile.enable=true"], model=QWEN, slow=True
    ),  # ~10-25 s of compiling
    # Qwen3 MoE with its Switch-style balance loss on, as published: expert parallel, with PP
    # (the statistics travel through the pipeline to the last stage's loss), and compiled
    Case("qwen3_moe_ep", 2, [EP], model=QWEN_MOE),
    # (the loss is a micro-batch's, as transformers computes it per batch: microbatches of the
    # reference's 2 rows)
    Case("qwen3_moe_pp+ep", 4, [PP, EP, MB2, "--training.local_batch_size=4"], model=QWEN_MOE),
    # the pipeline's shape inference runs forward in eval and its backward recomputes in train:
    # the balance statistics are the same ops in both (op SAC checks op for op)
    Case(
        "qwen3_moe_pp_ac_op",
        2,
        [PP, MB2, "--activation_checkpoint.mode=selective", "--training.local_batch_size=8"],
        model=QWEN_MOE,
    ),
    # reshard always under PP with op SAC: the experts (a unit nested in the block's region) are
    # gathered at the region's entry, so its recompute runs the forward's ops (fsdp.py)
    Case(
        "qwen3_moe_pp+fsdp_always_ac_op",
        4,
        [
            PP,
            MB2,
            "--activation_checkpoint.mode=selective",
            "--parallelism.reshard_after_forward=always",
            "--training.local_batch_size=4",
        ],
        model=QWEN_MOE,
    ),
    Case(
        "qwen3_moe_pp_1F1B_grad_accum",
        2,
        [PP, MB2, _schedule("1F1B"), "--training.local_batch_size=4"],
        model=QWEN_MOE,
        slow=True,
    ),
    Case(
        "qwen3_moe_pp_ZBV",
        2,
        [PP, MB2, _schedule("ZBVZeroBubble"), "--training.local_batch_size=8"],
        model=QWEN_MOE,
        slow=True,
    ),
    Case("qwen3_moe_ep_compile", 2, [EP, "--compile.enable=true"], model=QWEN_MOE, slow=True),
    Case(
        "qwen3_moe_ep_ac_full",
        2,
        [EP, "--activation_checkpoint.mode=full"],
        model=QWEN_MOE,
        slow=True,
    ),
    Case(
        "qwen3_moe_simple_fsdp+ep",
        4,
        ["--parallelism.fsdp_implementation=simple_fsdp", EP, "--training.local_batch_size=2"],
        model=QWEN_MOE,
        slow=True,
    ),
    Case(
        "qwen3_moe_tp+ep",
        4,
        [TP, EP, "--training.local_batch_size=4"],
        model=QWEN_MOE_NOAUX,
        slow=True,
    ),
]


# Compiled twins: the fp32 eager cases again with each block compiled (fullgraph), held to
# 2e-5 of the 1-rank reference: eager layouts are within ~1e-6 of it, but for DeepSeek-V3
# TP 2 + EP 2, where eager itself is 1.05e-5 off in grad norm (TP's sharded sums) and the
# compiled run is exactly eager's. In `make test`: the
# DeepSeek-V3 TP + EP one (its embeddings once got no gradient when compiled: an in-flight TP
# collective entered the first compiled block) and Qwen3 MoE with EP (the Switch statistics,
# grouped GEMM and dynamic tokens per expert in the graph); Llama3's is fsdp_compile above.
COMPILED_IN_MAKE_TEST = {"deepseek_fsdp+tp+ep", "qwen3_moe_ep"}
COMPILE_RTOL = 2e-5


def compiled_twin(case: Case) -> Case:
    """In `make test` with the aot_eager backend (the graph capture, AOTAutograd and the
    partitioner, where the TP + EP bug lived, without inductor's minutes of codegen on 2
    cores; `fsdp_compile` runs inductor there); with --slow, inductor."""
    fast = case.name in COMPILED_IN_MAKE_TEST
    backend = ["--compile.backend=aot_eager"] if fast else []
    return dataclasses.replace(
        case,
        name=f"{case.name}_compiled",
        slow=not fast,
        rtol=COMPILE_RTOL,
        overrides=[*case.overrides, "--compile.enable=true", *backend],
    )


# (twins of the `make test` cases, one per model x layout family, and of FSDP2 + TP)
CASES += [
    compiled_twin(c)
    for c in CASES
    if (not c.slow or c.name in COMPILED_IN_MAKE_TEST | {"fsdp+tp"})
    and c.dtype != BF16
    and c.launcher is None
    and not any("compile.enable" in o for o in c.overrides)
    and not any(o.endswith(ZERO_BUBBLE) for o in c.overrides)
]  # refused with compile (torch 2.13)


def read_losses(dump: str, key: str = "loss") -> list[float]:
    with open(os.path.join(dump, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if line.strip()]
    return [
        r[key] for r in records if "loss" in r
    ]  # training records (validation ones have no "loss")


def read_grad_norms(dump: str) -> list[float]:
    """Adam hides a wrong gradient scale from the loss (it is scale invariant), not from the
    gradient norm: e.g. experts' gradients averaged over the wrong number of ranks."""
    return read_losses(dump, "grad_norm")


DEVICE = "cpu"  # every run's --training.device; main() sets it from --device
TIMEOUT_S = 900.0  # per run; main() sets it from --timeout


LAUNCHERS = ("fast", "torchrun")


def launcher_name(launcher: str | None = None) -> str:
    """The launcher a run uses: the argument, else $TITAN_TEST_LAUNCHER, else "fast"."""
    name = launcher or os.environ.get("TITAN_TEST_LAUNCHER") or "fast"
    if name not in LAUNCHERS:
        raise ValueError(f"launcher {name!r}: one of {', '.join(LAUNCHERS)} (TITAN_TEST_LAUNCHER)")
    return name


def run_env(ngpu: int, log_dir: str, extra_env: dict | None = None) -> dict:
    """The environment run_train.sh is started with (launch())."""
    return {**os.environ, "NGPU": str(ngpu), "TORCHRUN_LOG_DIR": log_dir, **(extra_env or {})}


def chosen_launcher(env: dict, launcher: str | None = None) -> str:
    """launcher_name(), but "torchrun" when env changes a variable read at import time."""
    name = launcher_name(launcher)
    return "torchrun" if name == "fast" and fast_launch.needs_torchrun(env) else name


def kill_tree(pid: int) -> None:
    """SIGKILL `pid`, its process group and every process below it: run_train.sh's launcher
    runs in a process group of its own, and torchrun's workers in sessions of their own."""
    children: dict[int, list[int]] = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as f:
                children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(
                    int(name)
                )
        except OSError:
            continue
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += children.get(p, [])
    for p in [pid, *tree]:
        try:
            os.killpg(p, signal.SIGKILL) if p == pid else os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def launch(
    ngpu: int,
    args: list[str],
    log_dir: str,
    extra_env: dict | None = None,
    launcher: str | None = None,
) -> tuple[int, float, str]:
    """Train with `run_train.sh <args>` on `ngpu` ranks; (exit code, seconds, console output).

    launcher "torchrun" runs run_train.sh itself (every rank's output also under log_dir, its
    TORCHRUN_LOG_DIR); "fast" (the default) forks the ranks from a process that imported
    torchtitan once per session (fast_launch.py: the same argv, environment, per-rank log
    files under log_dir and console), unless extra_env changes what is read at import time.
    The console is what run_train.sh shows: the LOG_RANK ranks' output (default rank 0).
    Exit code 124: killed at TIMEOUT_S."""
    env = run_env(ngpu, log_dir, extra_env)
    start = time.perf_counter()
    if chosen_launcher(env, launcher) == "fast":
        # run_train.sh runs a dry run (--job.dry_run=true) in one process of torchtitan.dry_run
        rc, out = fast_launch.launch(
            ngpu, args, log_dir, env, TIMEOUT_S, dry_run="--job.dry_run=true" in args
        )
    else:
        proc = subprocess.Popen(
            [RUN_TRAIN, *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )  # its own process group: a timeout kills every rank
        try:
            out, _ = proc.communicate(timeout=TIMEOUT_S)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            out, _ = proc.communicate()
            rc = 124
        out = re.sub(
            r"(?m)^\[default\d+\]:", "", out
        )  # torchrun's --tee prefix: the console as without it
    if rc == 124:
        out += f"\n[run_tests] killed after {TIMEOUT_S:.0f}s (--timeout)\n"
    return rc, time.perf_counter() - start, out


def run(
    ngpu: int,
    overrides: list[str],
    dump: str,
    extra_env: dict | None = None,
    model: str = "llama3",
    dtype: str = "float32",
    launcher: str | None = None,
) -> tuple[int, float, str]:
    """One training run of the suite's settings (BASE) plus `overrides`; (exit code, seconds,
    output). Every rank's output also goes to <dump>/ranks/ and a failed or timed-out run's
    output ends with each rank's last lines. Exit code 124: killed at TIMEOUT_S. launcher:
    see launch()."""
    logs = os.path.join(dump, "ranks")
    name, flavor, model_args = MODELS.get(model, (model, "tiny", []))
    args = [
        f"--model.name={name}",
        *BASE,
        f"--model.flavor={flavor}",
        *model_args,
        f"--training.device={DEVICE}",
        f"--training.mixed_precision_param={dtype}",
        *overrides,
        f"--job.dump_folder={dump}",
    ]
    rc, secs, out = launch(ngpu, args, logs, extra_env, launcher)
    if rc != 0:
        out += rank_tails(logs)
    return rc, secs, out


def rank_tails(log_dir: str, lines: int = 8) -> str:
    """The last lines of every rank's stdout and stderr under a torchrun --log-dir."""
    out = []
    for root, _, files in sorted(os.walk(log_dir)):
        for name in sorted(files):
            if name in ("stdout.log", "stderr.log"):
                with open(os.path.join(root, name), errors="replace") as f:
                    tail = [ln.rstrip() for ln in f.readlines() if ln.strip()][-lines:]
                if tail:
                    rank = os.path.basename(root)
                    out.append(f"--- rank {rank} {name}:\n" + "\n".join(tail))
    return ("\n" + "\n".join(out) + "\n") if out else ""


def skip_reason(case: Case, device: str, gpus: int) -> str:
    """Why `case` cannot run here ("" if it can)."""
    if device == "cuda" and case.ngpu > gpus:
        return f"needs {case.ngpu} GPUs, {gpus} present"
    return ""


def cuda_count() -> int:
    """GPUs torch sees, asked in a child process (this one stays free of CUDA)."""
    code = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return int(proc.stdout.strip() or 0) if proc.returncode == 0 else 0


def max_rel_diff(a: list[float], b: list[float]) -> float:
    if len(a) != len(b):
        return float("inf")
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))


def main(argv=None) -> int:
    global DEVICE, TIMEOUT_S
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--ngpu", type=int, default=8, help="run the cases of at most this many ranks")
    ap.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="cpu: every rank a CPU process (gloo); cuda: one GPU per rank (NCCL)",
    )
    ap.add_argument("--filter", default="", help="only cases whose name contains this")
    ap.add_argument("--slow", action="store_true", help="include the slow cases")
    ap.add_argument(
        "--timeout", type=float, default=TIMEOUT_S, help="seconds a run may take (default 900)"
    )
    ap.add_argument("--out", default="", help="folder for the runs (default: a temporary one)")
    ap.add_argument("--list", action="store_true", help="print the cases and exit")
    ap.add_argument(
        "--launcher",
        choices=LAUNCHERS,
        help="fast: ranks forked from one process that imported torchtitan once (default on cpu);"
        " torchrun: run_train.sh (default on cuda); also TITAN_TEST_LAUNCHER",
    )
    args = ap.parse_args(argv)
    if args.launcher:
        os.environ["TITAN_TEST_LAUNCHER"] = args.launcher
    elif (
        args.device == "cuda"
    ):  # the fast launcher has not been tried on GPUs yet: opt in with --launcher fast
        os.environ.setdefault("TITAN_TEST_LAUNCHER", "torchrun")
    DEVICE, TIMEOUT_S = args.device, args.timeout

    cases = [
        c
        for c in CASES
        if c.ngpu <= args.ngpu and args.filter in c.name and (args.slow or not c.slow)
    ]
    if args.list:
        for c in cases:
            print(f"{c.name:32s} {c.ngpu}  {' '.join(c.overrides)}")
        return 0
    if not cases:
        print(
            f"error: no case matches --filter '{args.filter}' with --ngpu {args.ngpu}",
            file=sys.stderr,
        )
        return 2
    gpus = cuda_count() if args.device == "cuda" else 0
    skipped = {c.name: skip_reason(c, args.device, gpus) for c in cases}
    out = args.out or tempfile.mkdtemp(prefix="titan_suite_")
    print(
        f"device {args.device}"
        + (f" ({gpus} GPUs)" if args.device == "cuda" else "")
        + f", runs in {out}"
    )

    references = {}
    for model, dtype, mask in dict.fromkeys(
        (c.model, c.dtype, c.attn_mask) for c in cases if not skipped[c.name]
    ):
        name = reference_name(model, dtype, mask)
        rc, secs, log = run(
            1, [f"--model.attn_mask={mask}"], os.path.join(out, name), model=model, dtype=dtype
        )
        if rc != 0:
            print(log[-3000:])
            print(f"error: the 1-rank {model} {dtype} reference run failed", file=sys.stderr)
            return 1
        references[name] = (
            read_losses(os.path.join(out, name)),
            read_grad_norms(os.path.join(out, name)),
        )
        print(f"{name} (1 rank): final loss {references[name][0][-1]:.6f}  ({secs:.1f}s)")
    print(
        f"{'case':32s} {'world':>5s}  {'result':6s} {'loss diff':>10s} {'gnorm diff':>10s} {'final loss':>10s}"
        f" {'wall s':>7s}"
    )
    failures = 0
    for case in cases:
        if skipped[case.name]:
            print(f"{case.name:32s} {case.ngpu:>5d}  SKIP   {skipped[case.name]}", flush=True)
            continue
        dump = os.path.join(out, case.name)
        rc, secs, log = run(
            case.ngpu,
            case.overrides,
            dump,
            model=case.model,
            dtype=case.dtype,
            launcher=case.launcher,
        )
        losses = (
            read_losses(dump)
            if rc == 0 and os.path.exists(os.path.join(dump, "metrics.jsonl"))
            else []
        )
        ref_losses, ref_norms = references[reference_name(case.model, case.dtype, case.attn_mask)]
        diff = max_rel_diff(losses, ref_losses) if losses else float("inf")
        norm_diff = max_rel_diff(read_grad_norms(dump), ref_norms) if losses else float("inf")
        ok = rc == 0 and max(diff, norm_diff) <= tolerance(case)
        failures += not ok
        final = f"{losses[-1]:.6f}" if losses else "-"
        print(
            f"{case.name:32s} {case.ngpu:>5d}  {'PASS' if ok else 'FAIL':6s} {diff:>10.2e} {norm_diff:>10.2e}"
            f" {final:>10s} {secs:>7.1f}",
            flush=True,
        )
        if not ok:
            print(f"--- {case.name}: exit {rc}; last output:\n{log[-6000:]}\n---")
    n_skipped = sum(bool(v) for v in skipped.values())
    print(f"{len(cases) - failures - n_skipped} passed, {failures} failed, {n_skipped} skipped")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
