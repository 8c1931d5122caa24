"""The layout search's first, cheap estimate of a layout's step time and peak memory,
torch-free and in microseconds: it orders tens of thousands of layouts so that only the best
few are simulated in full (layout_search.py). It is judged by how often its order disagrees
with the full prediction's, which the search reports; nothing else uses it.

From the model's parameter shapes (models/<name>/shapes.py) and the hardware profile:
- compute: the model's FLOPs per device (6 per active weight per token, attention causal:
  half its square), times the recompute of the AC mode (full: the forward again, +1/3;
  layer SAC every 2nd block: +1/6; op SAC: its memory-bound ops only, +2%), at the GEMM
  efficiency of the layout's matmul size (TP and small microbatches shrink it) and the
  attention efficiency; memory-bound ops as bytes per token per block at HBM speed
  (compiled: the profile's fused fraction);
- communication: ring collectives of collective_seconds (step_time.py) on the link each
  group crosses. FSDP's gathers (bf16) and reductions (fp32) overlap compute, only what
  exceeds it is exposed, plus the first unit's gather; TP's (sequence parallel: 4 per block
  forward, 4 backward, 4 more when recomputed), CP's K/V gathers and EP's all-to-alls (2
  each way per MoE block) are on the critical path;
- pipeline: the 1F1B bubble (pp - 1) / (microbatches x stages per rank) of the compute;
- memory: the exact model-states floor (model_states.py) plus activations per token and
  block by AC mode (bf16, sequence-parallel over TP, CP's share of the sequence; 1F1B's
  first rank holds min(microbatches, pp) microbatches in flight), gathered bf16 parameters
  and unsharded fp32 gradients (under PP the stage's, kept for the step; without it two
  blocks, or every block when kept after forward), and the last stage's fp32 logits.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchtitan.hardware import HardwareProfile
from torchtitan.planning.search.space import Layout
from torchtitan.planning.step_time.model import collective_seconds

# recomputed fraction of the forward by AC mode (of the forward's FLOPs; forward = 1/3 of a step's)
RECOMPUTE = {"none": 0.0, "op": 0.02, "layer2": 0.5, "full": 1.0}
# bytes a block saves for backward per token, in units of the hidden dim (bf16), by AC mode:
# none ~50 (a Llama block: norms, Q/K/V, attention output and its statistics, the SwiGLU
# inputs and product), op SAC ~23 (every matmul output), layer SAC every 2nd block: the mean
# of none and full, full: the block's input (2), with one block's activations live while it
# is recomputed. From the full prediction of Llama3 8B (32 blocks x 8,192 tokens: AC none
# 94.0 GiB, op SAC 67.0 GiB at one sequence per rank, reshard never).
SAVED_PER_TOKEN_BLOCK = {"none": 50.0, "op": 23.0, "layer2": 26.0, "full": 2.0}
MEMORY_BYTES_PER_TOKEN_BLOCK = (
    40  # x hidden dim: bytes memory-bound ops move per token and block, forward
)


@dataclass(frozen=True)
class ModelFacts:
    """What the estimate needs of a model, from its shapes and args (per_block lists)."""

    dim: int
    n_layers: int
    vocab: int
    heads_x_head_dim: int  # attention width (heads x head dim)
    kv_width: int  # per token, the K and V values CP gathers
    dense_per_block: list[int]  # elements, not routed experts
    expert_per_block: list[int]  # routed-expert elements
    active_fraction: float  # top_k / experts (1 without)
    top_k: int  # routed experts per token (1 without)
    moe_inter: int  # a routed expert's hidden width (0 without)
    embed_elements: int
    head_elements: int  # output head (and final norm)
    total_elements: int


def model_facts(shapes, args) -> ModelFacts:
    """`args`: models.protocol.ModelArgs (its attention and experts as the model states them)."""
    moe, att = args.moe, args.attention
    # attention FLOPs per head go with the mean of its query/key and value widths
    width = int(att.n_heads * (att.qk_head_dim + att.v_head_dim) / 2) if att else 0
    dense = [sum(p.numel for p in b if not p.expert) for b in shapes.blocks]
    expert = [sum(p.numel for p in b if p.expert) for b in shapes.blocks]
    first, last = sum(p.numel for p in shapes.first), sum(p.numel for p in shapes.last)
    return ModelFacts(
        args.dim,
        args.n_layers,
        args.vocab_size,
        width,
        att.kv_width if att else 0,
        dense,
        expert,
        moe.n_activated_experts / moe.n_routed_experts if moe else 1.0,
        moe.n_activated_experts if moe else 1,
        moe.moe_inter_dim if moe else 0,
        first,
        last,
        first + last + sum(dense) + sum(expert),
    )


@dataclass(frozen=True)
class Estimate:
    step_seconds: float
    tokens_per_second_per_device: float
    peak_bytes: float  # the estimate's, not a prediction
    parts: dict
    step_tokens_per_device: float = 0.0

    def rescaled(self, compute: float) -> Estimate:
        """The estimate with its compute (and the bubble, a share of it) times `compute`: the
        search scales it by what the full simulations found (layout_search.py)."""
        scaled = {
            k: v * compute if k in ("compute", "bubble") else v for k, v in self.parts.items()
        }
        step = sum(scaled.values())
        return Estimate(
            step,
            self.step_tokens_per_device / step,
            self.peak_bytes,
            scaled,
            self.step_tokens_per_device,
        )


def _link_ranks(size: int, stride: int) -> list[int]:
    """Global ranks of a group of `size` ranks `stride` apart (mesh order pp, dp_replicate,
    dp_shard, cp, tp: tp innermost)."""
    return [i * stride for i in range(size)]


def estimate(
    layout: Layout,
    facts: ModelFacts,
    states_bytes: int,
    hw: HardwareProfile,
    *,
    seq_len: int,
    global_batch: int,
    compiled: bool,
) -> Estimate:
    """The cheap step time and peak of `layout` (module docstring); `states_bytes`: the
    model-states floor of its busiest rank (model_states.py)."""
    L, D, h = layout, layout.degrees, facts.dim
    world = D.dp * D.tp * D.pp * D.cp
    accum = global_batch // (D.dp * L.local_batch)
    microbatches = L.local_batch // L.microbatch if D.pp > 1 else 1
    stages_per_rank = 2 if L.schedule == "Interleaved1F1B" else 1
    tokens_mb = (
        (L.microbatch if D.pp > 1 else L.local_batch) * seq_len // D.cp
    )  # a rank's tokens per (micro)batch
    blocks_rank = facts.n_layers / D.pp
    step_tokens = global_batch * seq_len
    # compute (per device, the whole step)
    active_block = sum(
        d + e * facts.active_fraction for d, e in zip(facts.dense_per_block, facts.expert_per_block)
    )
    gemm_flops = 6.0 * (active_block + facts.head_elements) * step_tokens / world
    attn_flops = 6.0 * facts.n_layers * facts.heads_x_head_dim * seq_len / 2 * step_tokens / world
    recompute = RECOMPUTE[L.ac] / 3.0
    size = (
        2.0 * tokens_mb * h * h / D.tp
    )  # a typical matmul's FLOPs (tokens x hidden^2, split by TP)
    eff = hw.gemm_efficiency * size / (size + hw.gemm_half_gflop * 1e9)
    peak = hw.peak_flops("bfloat16")
    compute = gemm_flops / (peak * eff) + attn_flops / (
        peak * hw.attention_eff(facts.heads_x_head_dim)
    )
    mem_bytes = 3 * MEMORY_BYTES_PER_TOKEN_BLOCK * h * facts.n_layers * step_tokens / world
    compute += (
        mem_bytes
        * (hw.compiled_memory_fraction if compiled else 1.0)
        / (hw.hbm_gbps * 1e9 * hw.memory_efficiency)
    )
    compute *= 1.0 + recompute
    # TP, CP, EP: on the critical path, per block and microbatch
    passes = accum * (microbatches if D.pp > 1 else 1) * blocks_rank
    comm = {}
    if D.tp > 1:
        act = 2 * tokens_mb * h  # bf16 activations of a microbatch
        per = 2 * (
            collective_seconds("all_gather", act, _link_ranks(D.tp, 1), hw)
            + collective_seconds("reduce_scatter", act, _link_ranks(D.tp, 1), hw)
        )
        comm["tp"] = passes * per * (2 + RECOMPUTE[L.ac])
    if D.cp > 1:
        kv = 2 * tokens_mb * D.cp * facts.kv_width / D.tp
        comm["cp"] = passes * 2 * collective_seconds("all_gather", kv, _link_ranks(D.cp, D.tp), hw)
    if D.ep > 1:
        moe_blocks = sum(1 for e in facts.expert_per_block if e) / D.pp
        a2a = (
            2 * tokens_mb / D.tp * h * facts.top_k
        )  # bf16 token copies a rank sends (and receives)
        per = collective_seconds("all_to_all", a2a, _link_ranks(D.ep, 1), hw)
        comm["ep"] = (
            accum * (microbatches if D.pp > 1 else 1) * moe_blocks * per * (4 + 2 * RECOMPUTE[L.ac])
        )
    # FSDP / HSDP: overlapped with compute
    dense_rank = (
        sum(facts.dense_per_block) / D.pp + (facts.embed_elements + facts.head_elements) / D.pp
    ) / D.tp
    expert_rank = sum(facts.expert_per_block) / D.pp / max(D.ep, 1)
    shard = D.dp_shard * D.cp
    fsdp = 0.0
    if shard > 1:
        gathers = (
            1
            if (D.pp > 1 and L.reshard != "always")
            else (2 * accum * (microbatches if D.pp > 1 else 1) if L.reshard != "never" else accum)
        )
        reductions = 1 if D.pp > 1 else accum
        group = _link_ranks(shard, D.tp)
        fsdp = gathers * collective_seconds(
            "all_gather", 2 * (dense_rank + expert_rank), group, hw
        ) + reductions * collective_seconds(
            "reduce_scatter", 4 * (dense_rank + expert_rank), group, hw
        )
    if D.dp_replicate > 1:
        fsdp += collective_seconds(
            "all_reduce",
            4 * (dense_rank + expert_rank) / shard,
            _link_ranks(D.dp_replicate, shard * D.tp),
            hw,
        )
    first_gather = fsdp / max(1, blocks_rank) / 2
    comm["fsdp"] = max(0.0, fsdp - compute) + first_gather
    # pipeline
    bubble = 0.0
    if D.pp > 1:
        bubble = compute * (D.pp - 1) / (microbatches * stages_per_rank)
        p2p = 2 * tokens_mb * h / D.tp
        comm["pp"] = (
            accum
            * microbatches
            * stages_per_rank
            * 2
            * collective_seconds("send", p2p, [0, D.tp * D.cp * D.dp], hw)
        )
    optimizer = 3 * 16 * states_bytes / 16 / (hw.hbm_gbps * 1e9 * hw.memory_efficiency)
    step = compute + bubble + sum(comm.values()) + optimizer
    # memory
    moe_extra = 0.0  # a routed block also saves its token copies in and out and the experts' inputs
    if facts.top_k > 1:
        moe_extra = (
            facts.top_k
            * (4 * h + 6 * facts.moe_inter)
            * sum(1 for e in facts.expert_per_block if e)
            / facts.n_layers
        )
    saved = SAVED_PER_TOKEN_BLOCK[L.ac] * h + (
        moe_extra if L.ac == "none" else moe_extra / 2 if L.ac != "full" else 0
    )
    transient = SAVED_PER_TOKEN_BLOCK["none"] * h + moe_extra if L.ac in ("full", "layer2") else 0
    in_flight = min(microbatches, D.pp) * (1.5 if stages_per_rank > 1 else 1.0) if D.pp > 1 else 1
    activations = (saved * blocks_rank * in_flight + transient) * tokens_mb / D.tp
    unsharded = dense_rank + expert_rank
    if D.pp > 1 or L.reshard == "never":
        gathered = 2 * unsharded + (4 * unsharded if D.pp > 1 else 0)
    else:
        gathered = 6 * 2 * unsharded / max(blocks_rank, 1)
    logits = 10 * tokens_mb * facts.vocab / D.tp
    peak_bytes = states_bytes + activations + gathered + logits
    parts = {
        "compute": compute,
        "bubble": bubble,
        "optimizer": optimizer,
        **{f"comm_{k}": v for k, v in comm.items()},
    }
    return Estimate(step, step_tokens / step / world, peak_bytes, parts, step_tokens / world)
