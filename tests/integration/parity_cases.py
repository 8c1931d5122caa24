"""The multi-rank parity suite's case table: the settings every run shares (BASE), the cases
(each a run_train.sh layout on 1-8 ranks), their 1-rank references and tolerances.

The runner that launches and compares them is run_tests.py (also its CLI); under pytest,
test_parity_suite.py. Each case trains the tiny Llama3 (or DeepSeek-V3, deepseek_*; Qwen3,
qwen3_*) for STEPS steps with the same global batch as its reference: the 1-rank run of the
same model, parameter dtype and attention mask (reference_name()). A case passes when every
step's loss and gradient norm are within tolerance() (relative) of the reference's. Cases
marked slow run only with `run_tests.py --slow` / `make test-slow`.

Adding a model: `Case("<name>_fsdp", 2, model="<name>")` trains its tiny flavor on 2 ranks
against its own 1-rank reference.
"""

import dataclasses
from dataclasses import dataclass, field

from torchtitan.distributed.pipeline_layout import ZERO_BUBBLE  # torch-free

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
        None  # None: run_tests.launcher_name()'s choice ("fast" unless TITAN_TEST_LAUNCHER says)
    )


# bf16 vs a bf16 1-rank reference: the same math in another order (sharded reductions, other
# matmul splits) rounds differently in bf16's 8-bit mantissa. Measured on CPU over 10 steps
# (README): at most 1.5e-5 (loss) and 6.8e-5 (gradient norm); CPU matmuls accumulate bf16
# products in fp32. GPU kernels split and accumulate differently: a looser bound there.
BF16_RTOL = {"cpu": 1e-3, "cuda": 2e-2}
BF16 = "bfloat16"


def tolerance(case: "Case", device: str = "cpu") -> float:
    """The largest relative difference from its reference `case` may show on `device`."""
    return BF16_RTOL[device] if case.dtype == BF16 else case.rtol


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
ETP = "--parallelism.expert_tensor_parallel_degree=2"
EP4 = "--parallelism.expert_parallel_degree=4"
NO_LOSS_PARALLEL = "--parallelism.loss_parallel=false"
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
    # (Llama3 TP alone in `make test`, with loss parallel; FSDP2 + TP there: test_checkpoint.py)
    Case("tp", 2, [TP, "--training.local_batch_size=8"]),
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
    # (alone in `make test`: 1F1B, GPipe and LoopedBFS, which run with FSDP only with --slow;
    # the others run with FSDP in `make test`, below and in test_checkpoint.py)
    *[
        Case(
            f"pp_{name}",
            2,
            [PP, _schedule(name), "--training.local_batch_size=8"],
            slow=name not in ("1F1B", "GPipe", "LoopedBFS"),
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
    # (with FSDP in `make test`: the zero-bubble schedules, whose weight pass FSDP2 must see;
    # Interleaved1F1B is test_checkpoint.py's pp+fsdp; 1F1B, GPipe and LoopedBFS only with --slow:
    # alone above, and FSDP2 sees them as it sees Interleaved1F1B)
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
    Case("qwen3_simple_fsdp", 2, ["--parallelism.fsdp_implementation=simple_fsdp"], model=QWEN),
    Case("qwen3_tp", 2, [TP, "--training.local_batch_size=8"], model=QWEN),
    Case("qwen3_pp", 2, [PP, "--training.local_batch_size=8"], model=QWEN),
    # every schedule (V schedules: both tied copies on pipeline rank 0, summed locally: DualPipeV
    # in `make test`)
    *[
        Case(
            f"qwen3_pp_{name}",
            2,
            [PP, _schedule(name), "--training.local_batch_size=8"],
            model=QWEN,
            slow=name != "DualPipeV",
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
    Case(
        "qwen3_moe_tp+ep4",
        4,
        [TP, EP4, "--training.local_batch_size=2"],
        model=QWEN_MOE,
        slow=True,
    ),
    Case(
        "deepseek_v3_pp+fsdp+tp+ep",
        8,
        [PP, TP, EP4, "--training.local_batch_size=4", _schedule("Interleaved1F1B")],
        model=DS,
        slow=True,
    ),
]


# Compiled twins: the fp32 eager cases again with each block compiled (fullgraph), held to
# 2e-5 of the 1-rank reference: eager layouts are within ~1e-6 of it, but for DeepSeek-V3
# TP 2 + EP 2, where eager itself is 1.05e-5 off in grad norm (TP's sharded sums) and the
# compiled run is exactly eager's. In `make test`: Qwen3 MoE with EP (the Switch statistics,
# grouped GEMM and dynamic tokens per expert in the graph); Llama3's is fsdp_compile above.
# DeepSeek-V3 TP + EP compiled (its embeddings once got no gradient when compiled: an
# in-flight TP collective entered the first compiled block) is in `make test` as
# test_mtp_parity.py's tp2+ep2_compile (2 ranks, with MTP) and test_compile_graphs_run.py's
# Llama3 TP case; its 4-rank twin here runs with --slow.
# The cases of upstream's pipeline split and of its feature keys, in files of their own (they
# import Case from here, so they come in after it is defined).
import feature_cases  # noqa: E402
import float8_cases  # noqa: E402
import muon_cases  # noqa: E402
import pipeline_cases  # noqa: E402

MODELS.update(pipeline_cases.MODELS)
MODELS.update(float8_cases.MODELS)
MODELS.update(muon_cases.MODELS)
CASES += pipeline_cases.CASES + feature_cases.CASES + float8_cases.CASES + muon_cases.CASES

COMPILED_IN_MAKE_TEST = {"qwen3_moe_ep", "float8_fsdp_all_gather"}
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


# The cases with a compiled twin: one per model x layout family of the float32 eager cases
# (launched as any other, no zero-bubble schedule: refused with compile in torch 2.13), and
# FSDP2 + TP. Named, so that moving a case in or out of `make test` leaves its twin as it is.
TWINNED = (
    "hsdp",
    "ddp",
    "grad_accum",
    "fsdp+tp",
    "pp_1F1B",
    "simple_fsdp",
    "fsdp_ac_full",
    "fsdp_ac_op",
    "fsdp_ac_layer",
    "cp2",
    "cp2+fsdp",
    "block_causal_cp2",
    "deepseek_ddp",
    "deepseek_ep_all_of_dp_shard",
    "deepseek_fsdp+tp+ep",
    "deepseek_pp+fsdp+ep",
    "deepseek_ep_ac_full",
    "deepseek_ep_ac_op",
    "deepseek_simple_fsdp+ep_op_sac",
    "qwen3_fsdp",
    "qwen3_tp",
    "qwen3_pp",
    "qwen3_cp2",
    "qwen3_moe_ep",
    "qwen3_moe_pp+ep",
    "qwen3_moe_pp_ac_op",
    "qwen3_moe_pp+fsdp_always_ac_op",
)


def can_compile(case: Case) -> bool:
    """A float32 eager case that the compiled trainer accepts."""
    return (
        case.dtype != BF16
        and case.launcher is None
        and not any("compile.enable" in o for o in case.overrides)
        and not any(o.endswith(ZERO_BUBBLE) for o in case.overrides)
    )


_TWINS = [compiled_twin(c) for c in CASES if c.name in TWINNED and can_compile(c)]
assert len(_TWINS) == len(TWINNED), "every twinned case exists and compiles"
# float8's twins keep their eager case's bound (the float8 rounding of fp32 noise; the twin
# against its eager case is held tighter: test_parity_suite.py)
_TWINS += [
    dataclasses.replace(compiled_twin(c), rtol=c.rtol)
    for c in CASES
    if c.name in float8_cases.TWINNED and can_compile(c)
]
CASES += _TWINS


def reference_overrides(attn_mask: str) -> list[str]:
    """What a 1-rank reference run adds to BASE (its model and dtype go as run()'s own)."""
    return [] if attn_mask == "causal" else [f"--model.attn_mask={attn_mask}"]


# reference name -> (model, dtype, attn_mask): the 1-rank runs the cases are compared with
REFERENCES = {
    reference_name(c.model, c.dtype, c.attn_mask): (c.model, c.dtype, c.attn_mask) for c in CASES
}
BY_NAME = {c.name: c for c in CASES}
assert len(BY_NAME) == len(CASES), "case names are unique"
