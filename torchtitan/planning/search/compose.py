"""Every layout's step time and peak, composed from one probe of the model's block: the
layout search scores every feasible layout with the step-time model's own terms
(planning/step_time/model.py), not a guess that orders them.

The probe (`probe`): the job's model with 1 and with 2 blocks, simulated like a dry run
(planning/memory/predict.py) on 2 ranks (FSDP 2, no TP/CP/PP/EP, one sequence per rank), once
per AC mode the search tries. The 2-block minus the 1-block simulation is one block: its
device time, recompute, host dispatch and the activations it keeps, per token; the 1-block
simulation less one block is the rest (embeddings, output head, loss, optimizer). Device time
is timed on the job's hardware profile with the host apart (the profile's host_async off),
so what is host and what is kernel stay separate.

A layout is then composed (`compose`) from what the probe measured and what the layout
changes exactly:
- per block and microbatch: the GEMMs of the block's own weight shapes at the layout's
  tokens and TP split (models/<name>/shapes.py; the profile's GEMM efficiency by size, as the
  trace times each GEMM), grouped GEMMs of the routed experts, attention FLOPs of the
  layout's sequence and CP (causal blocks only, as a GPU runs them), and the probe's
  memory-bound time and recompute scaled by tokens per rank; host time the probe's, with
  DTensor's per-op cost under eager TP;
- float8 linears (planning.layout_float8 = choose; `Float8`): the converted weights' GEMMs at
  the profile's float8 peak, FSDP's gathers of them at 1 byte with the float8 all-gather,
  sequence parallel's forward gathers in float8; the casts are in the float8 probe's
  memory-bound time;
- the layout's collectives by kind, bytes and group (TP's sequence-parallel gathers and
  reductions, CP's K/V gathers, EP's all-to-alls, FSDP's per-unit gathers and reductions,
  HSDP's and DDP's all-reduces, the pipeline's P2P), on the ranks of the layout's mesh;
- the same `Streams` (overlap, one physical link at a time) times each pipeline action, or
  the whole forward/backward without PP, at 1 and 2 blocks, extrapolated in blocks as the
  dry run does; the same pipeline event simulation runs the schedule's real order
  (pipeline.order_for), gradient reductions included; the step tail scales with the
  rank's parameters;
- the peak: the exact model-states floor (model_states.py) + the probe's kept activations
  per token and block x the rank's tokens, blocks and microbatches in flight (and EP's
  all-to-all buffers) + its transient bytes per token + the gathered parameters and
  unsharded gradients the layout keeps.

What it leaves out of the full prediction: the exact op order inside a block (each block is
one compute run between its collectives), the probe's block kind for every block
(DeepSeek-V3's dense prefix is timed as its MoE blocks for the memory-bound part; GEMMs and
attention follow each block's own shapes), and the worst-case expert routing. The search
checks it: the top layouts are also simulated in full and the differences printed
(planning/search/search.py).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from types import SimpleNamespace

from torchtitan.distributed.plan import BLOCKS
from torchtitan.hardware import HardwareProfile
from torchtitan.planning.step_time import cpu_sharing
from torchtitan.planning.step_time import model as step_time
from torchtitan.planning.step_time import pipeline as pipeline_time
from torchtitan.planning.step_time.rank import _stretch
from torchtitan.planning.step_time.trace import Comm, Compute, Segment, causal_kept

ACT_BYTES = 2  # bf16 activations on the wire (TP, CP, EP, P2P): Model.act_bytes's default
_EXTRAPOLATE_FROM = 4  # pipelines of more than this x pp microbatches: extrapolated (_pipeline)
REDUCE_BYTES = 4  # FSDP: fp32 gradients reduced (parameters gathered at Model.act_bytes)


@dataclass(frozen=True)
class Float8:
    """A layout with float8 linears (quantize.linear.float8): what changes in its kernels and
    collectives (the casts and what torchao saves are in the float8 probe)."""

    names: frozenset  # converted weights, block weights without their f"{BLOCKS}.<i>." prefix
    gather: bool  # FSDP gathers the converted weights in float8 (1 byte per element)
    tp: bool  # sequence parallel gathers block inputs in float8 (tensorwise: torchao's styles)
    wgrad: bool  # the weight gradient's GEMM in float8 too (all but rowwise_with_gw_hp)

    def converted(self, p) -> bool:
        return local_name(p.name) in self.names


def local_name(name: str) -> str:
    """A block parameter's name without its block's prefix (any block's is the same)."""
    head, _, rest = name.partition(".")
    if head == BLOCKS and rest.split(".", 1)[0].isdigit():
        return rest.split(".", 1)[1]
    return name


@dataclass(frozen=True)
class BlockProbe:
    """One AC mode's probe (probe.py), per block (2 blocks minus 1) and for the rest, at
    `tokens` per rank; seconds on the job's hardware profile. "tp": the probe at TP 2."""

    tokens: int  # tokens per rank of the probe (one sequence)
    # memory-bound seconds that follow a unit's parameters (FSDP's copies around its 2
    # gathers and 1 reduction per pass in the probe), for `unit_elements` unsharded elements
    param_memory_s: float
    unit_elements: int
    memory_s: float  # a block's memory-bound device seconds that follow the tokens (TP 1)
    memory_tp2_s: float  # the same at TP 2 (what sequence parallel leaves unsplit shows)
    memory_cp2_s: float  # at CP 2, per the probe's tokens (CP's own chunking and copies)
    recompute_s: float  # device seconds AC recomputes per block
    host_s: float  # a block's host dispatch seconds (TP 1)
    host_tp_s: float  # at TP 2: every op a DTensor op
    host_cp_s: float  # at CP 2: its chunked attention's ops
    excess_s: float  # runs of ops whose host outlasts their kernels: seconds over max(dev, host)
    excess_tp_s: float
    excess_cp_s: float
    rest_memory_s: float  # embeddings, head, loss: memory-bound device seconds
    rest_host_s: float
    tail_s: float  # the step tail (clip, optimizer, ...) of the 1-block probe
    tail_block_s: float  # what one block adds to it
    kept_per_token: float  # activation bytes a block keeps per token until its backward
    kept_tp2_per_token: float  # at TP 2, per the probe's token (what TP leaves unsplit shows)
    kept_cp2_per_token: float  # at CP 2, per token a CP rank holds (its gathered K/V, masks)
    transient_per_token: float  # the 1-block peak less states, kept activations, the unit's own


@dataclass(frozen=True)
class Model:
    """What the composition needs of the model (torch-free: from its shapes and args)."""

    dim: int
    vocab: int
    n_layers: int
    n_heads: int
    qk_head_dim: int
    v_head_dim: int
    kv_width: int  # per token: the K and V values CP gathers (both)
    top_k: int
    blocks: list  # per block: its Params (models/shapes.Param)
    first: list
    last: list
    # bytes of an activation element and of a gathered parameter element: the job's
    # training.mixed_precision_param (2 for bfloat16; 4 when a job computes in float32)
    act_bytes: int = ACT_BYTES
    float8: Float8 | None = None  # float8 linears on (the layout search's float8 choice)


def model_of(shapes, args, param_dtype: str = "bfloat16") -> Model:
    """`args`: models.protocol.ModelArgs. A model that states no attention facts (a user's
    model package may not) composes without the attention term: the probe then measures its
    attention with the memory-bound time, linear in the tokens."""
    att, moe = args.attention, args.moe
    return Model(
        args.dim,
        args.vocab_size,
        args.n_layers,
        att.n_heads if att else 0,
        att.qk_head_dim if att else 0,
        att.v_head_dim if att else 0,
        att.kv_width if att else 0,
        moe.n_activated_experts if moe else 1,
        shapes.blocks,
        shapes.first,
        shapes.last,
        4 if param_dtype == "float32" else ACT_BYTES,
    )


def largest_block(m: Model) -> list:
    """The block kind the probe measures and every block is timed as (memory-bound, host)."""
    return max(m.blocks, key=lambda b: sum(p.numel for p in b))


# ---------------------------------------------------------------------------- analytic kernels


def _gemm_s(
    flops: float, hw: HardwareProfile, grouped: bool = False, dtype: str = "bfloat16"
) -> float:
    eff = hw.grouped_gemm_efficiency if grouped else hw.gemm_efficiency
    eff *= flops / (flops + hw.gemm_half_gflop * 1e9)
    return flops / (hw.peak_flops(dtype) * max(eff, 1e-9))


def gemm_seconds(
    params,
    tokens: int,
    hw,
    *,
    tp: int = 1,
    ep_rows: float = 0.0,
    etp: int = 1,
    float8: Float8 | None = None,
) -> float:
    """Forward + backward seconds of the GEMMs of `params` (one block, or the head): each
    dense weight [out, in] three GEMMs (forward, input and weight gradients) of
    2 x tokens x in x out / tp FLOPs, a converted weight's at the float8 peak (its weight
    gradient's too unless `float8.wgrad` is off); routed experts one grouped GEMM forward and
    one backward (twice the FLOPs) per weight over `ep_rows` routed rows."""
    total = 0.0
    for p in params:
        if len(p.shape) < 2:
            continue
        if p.expert:
            inner = math.prod(p.shape[1:]) / etp
            total += _gemm_s(2 * ep_rows * inner, hw, True) + _gemm_s(4 * ep_rows * inner, hw, True)
            continue
        split = tp if p.tp_dim is not None else 1
        flops = 2.0 * tokens * math.prod(p.shape) / split
        if float8 is not None and float8.converted(p):
            in_float8 = 3 if float8.wgrad else 2
            total += in_float8 * _gemm_s(flops, hw, dtype="float8")
            total += (3 - in_float8) * _gemm_s(flops, hw)
        else:
            total += 3 * _gemm_s(flops, hw)
    return total


def attention_seconds(m: Model, batch: int, seq: int, hw, *, tp: int = 1, cp: int = 1) -> float:
    """Forward + backward of one block's causal attention on a rank: the whole sequence's
    causal work (the blocks a GPU kernel runs) shared by CP's balanced chunks and TP's heads."""
    if not m.n_heads:
        return 0.0
    heads = m.n_heads / tp
    pairs = batch * heads * seq * seq * causal_kept(seq, seq, hw.attention_block) / cp
    fwd = 2.0 * pairs * (m.qk_head_dim + m.v_head_dim)
    bwd = 2.0 * pairs * (3 * m.qk_head_dim + 2 * m.v_head_dim)
    eff = hw.attention_eff(m.qk_head_dim)
    peak = hw.peak_flops("bfloat16")
    return (fwd + bwd) / (peak * eff)


# ---------------------------------------------------------------------------- the mesh's groups


def groups_of(d, hw) -> step_time.Groups:
    """Rank 0's groups in the layout's mesh (pp, dp_replicate, dp_shard, cp, tp: tp innermost;
    EP borrows the innermost ranks of dp_shard x cp x tp; expert FSDP the rest of them)."""
    tp, cp, shard, rep = d.tp, d.cp, d.dp_shard, d.dp_replicate

    def span(size: int, stride: int) -> list[int]:
        return [i * stride for i in range(size)]

    fsdp = [s * tp * cp + c * tp for s in range(shard) for c in range(cp)]
    inner = shard * cp * tp
    ranks = {
        "tp": span(tp, 1),
        "cp": span(cp, tp),
        "fsdp": fsdp,
        "ep": span(d.ep, 1),
        "efsdp": span(inner // max(d.ep, 1), max(d.ep, 1)) if d.ep > 1 else fsdp,
        "dp_replicate": span(rep, inner),
        "pp": [0, inner * rep] if d.pp > 1 else [0],
    }
    dims = {
        "tp": "tp",
        "cp": "cp",
        "fsdp": "dp_shard_cp" if cp > 1 else "dp_shard",
        "ep": "ep",
        "efsdp": "dp_shard_ep" if d.ep > 1 else ("dp_shard_cp" if cp > 1 else "dp_shard"),
        "dp_replicate": "dp_replicate",
        "pp": "pp",
    }
    groups = step_time.Groups(
        dims, ranks, frozenset({"fsdp", "efsdp"}), frozenset({"fsdp", "efsdp", "dp_replicate"})
    )
    # a CPU node's ranks share its cores (the full model's stretch; 1 on a GPU profile)
    groups.stretch = _stretch(hw, SimpleNamespace(world_size=d.world_size))
    return groups


# ---------------------------------------------------------------------------- composition


@dataclass
class Composed:
    step_seconds: float
    tokens_per_second_per_device: float
    peak_bytes: float
    parts: dict


@dataclass(frozen=True)
class _Costs:
    """One block's costs at a layout (per microbatch pass), and its collectives."""

    fwd: list  # Compute events
    bwd: list
    crit_fwd: tuple  # Comm on the critical path (TP, CP, EP) in forward
    crit_bwd: tuple
    gather: tuple  # FSDP's gathers of the unit (dense, experts)
    reduce: tuple  # its gradient reductions (and HSDP's / DDP's all-reduces)


def _block_costs(
    m: Model, block, pr: BlockProbe, lay, *, seq: int, hw, compiled: bool, skew: float
):
    d = lay.degrees
    batch = lay.microbatch if d.pp > 1 else lay.local_batch
    tokens = batch * seq // d.cp  # a rank's tokens per pass
    scale = tokens / pr.tokens / d.tp
    moe = any(p.expert for p in block)
    rows = tokens * m.top_k * skew if moe else 0.0
    kernels = gemm_seconds(block, tokens, hw, tp=d.tp, ep_rows=rows, etp=d.etp, float8=m.float8)
    kernels += attention_seconds(m, batch, seq, hw, tp=d.tp, cp=d.cp)
    # memory-bound time: A + B / tp per probe token (what TP splits and what it does not),
    # from the probes at TP 1 and 2; then the layout's tokens per rank
    unsplit = max(0.0, 2 * pr.memory_tp2_s - pr.memory_s)
    per_probe = unsplit + (pr.memory_s - unsplit) / d.tp
    if d.cp > 1:  # what CP adds per token (its chunking, masks and copies)
        per_probe += max(0.0, pr.memory_cp2_s - pr.memory_s)
    memory = per_probe * tokens / pr.tokens
    # host: the probe's; TP's and CP's extra dispatch (DTensor, the chunked attention) added
    host = (
        pr.host_s
        + (pr.host_tp_s - pr.host_s) * (d.tp > 1)
        + (pr.host_cp_s - pr.host_s) * (d.cp > 1)
    )
    excess = max(
        0.0,
        pr.excess_s
        + (pr.excess_tp_s - pr.excess_s) * (d.tp > 1)
        + (pr.excess_cp_s - pr.excess_s) * (d.cp > 1),
    )
    fwd = Compute(device_s=(kernels + memory) / 3, host_s=host / 3)
    bwd = Compute(
        device_s=2 * (kernels + memory) / 3, recompute_s=pr.recompute_s * scale, host_s=2 * host / 3
    )
    if excess > 0:  # host-bound runs between the kernels: time on top of max(device, host)
        fwd = [fwd, Compute(host_s=excess / 3)]
        bwd = [bwd, Compute(host_s=2 * excess / 3)]
    else:
        fwd, bwd = [fwd], [bwd]
    crit_f, crit_b = [], []
    act = m.act_bytes * tokens * m.dim
    if d.tp > 1:  # sequence parallel: gather before attention and MLP, reduce-scatter after
        pair = [
            Comm("all_gather", "tp", act, "functional"),
            Comm("reduce_scatter", "tp", act, "functional"),
        ]
        crit_b += pair * 2
        if m.float8 is not None and m.float8.tp:  # the inputs cast to float8 before the gather
            pair = [Comm("all_gather", "tp", act // m.act_bytes, "functional"), pair[1]]
        crit_f += pair * 2
    if d.cp > 1:
        kv = m.act_bytes * tokens * d.cp * m.kv_width // d.tp
        crit_f.append(Comm("all_gather", "cp", kv, "functional"))
        crit_b.append(Comm("reduce_scatter", "cp", kv, "functional"))
    if moe and d.ep > 1:
        a2a = int(m.act_bytes * tokens / d.tp * m.dim * m.top_k * skew)
        crit_f += [Comm("all_to_all", "ep", a2a, "functional")] * 2
        crit_b += [Comm("all_to_all", "ep", a2a, "functional")] * 2
    dense = sum(p.numel / (d.tp if p.tp_dim is not None else 1) for p in block if not p.expert)
    expert = sum(p.numel / d.ep / d.etp for p in block if p.expert)
    gathered = m.act_bytes * dense
    if m.float8 is not None and m.float8.gather:  # the converted weights gathered in float8
        f8 = sum(
            p.numel / (d.tp if p.tp_dim is not None else 1) for p in block if m.float8.converted(p)
        )
        gathered -= (m.act_bytes - 1) * f8
    gather, reduce = [], []
    shard = d.dp_shard * d.cp
    if shard > 1:
        gather.append(Comm("all_gather", "fsdp", int(gathered), "c10d"))
        reduce.append(Comm("reduce_scatter", "fsdp", int(REDUCE_BYTES * dense), "c10d"))
        if expert:
            gather.append(Comm("all_gather", "efsdp", int(m.act_bytes * expert), "c10d"))
            reduce.append(Comm("reduce_scatter", "efsdp", int(REDUCE_BYTES * expert), "c10d"))
        # FSDP's copies around each gather and reduction: the probe's, per element the rank
        # gathers (the probe: 2 gathers and 1 reduction per pass)
        copy = pr.param_memory_s / 3 * (dense + expert) / max(1, pr.unit_elements)
        gather.append(Compute(device_s=copy))
        reduce.append(Compute(device_s=copy))
    if d.dp_replicate > 1:  # HSDP: the shard's gradients; DDP: the whole block's
        grads = REDUCE_BYTES * (dense + expert) / shard
        reduce.append(Comm("all_reduce", "dp_replicate", int(grads), "c10d"))
    return _Costs(fwd, bwd, tuple(crit_f), tuple(crit_b), tuple(gather), tuple(reduce))


def _bytes(events, kind: str = "") -> int:
    """Bytes of the collectives among `events` (of `kind`, or any)."""
    return sum(e.nbytes for e in events if isinstance(e, Comm) and kind in ("", e.kind))


def _rest(m: Model, pr: BlockProbe, lay, seq: int, hw) -> Compute:
    """The output head and loss (and embeddings) of one microbatch pass, forward + backward."""
    d = lay.degrees
    batch = lay.microbatch if d.pp > 1 else lay.local_batch
    tokens = batch * seq // d.cp
    scale = tokens / pr.tokens / d.tp
    kernels = gemm_seconds(m.last, tokens, hw, tp=d.tp, float8=m.float8)
    return Compute(device_s=kernels + pr.rest_memory_s * scale, host_s=pr.rest_host_s)


def _forward(costs: _Costs, n: int, gathers: bool, rest: Compute | None) -> list:
    events = []
    for _ in range(n):
        events += list(costs.gather) if gathers else []
        events += [dataclasses.replace(e) for e in costs.fwd]
        events += list(costs.crit_fwd)
    if rest is not None:  # the head's forward and the loss: a third of the rest
        events.append(Compute(device_s=rest.device_s / 3, host_s=rest.host_s / 3))
    return events


def _backward(costs: _Costs, n: int, gathers: bool, reduce: bool, rest: Compute | None) -> list:
    events = []
    if rest is not None:
        events.append(Compute(device_s=2 * rest.device_s / 3, host_s=2 * rest.host_s / 3))
    for _ in range(n):
        events += list(costs.gather) if gathers else []
        events += [dataclasses.replace(e) for e in costs.bwd]
        events += list(costs.crit_bwd)
        events += list(costs.reduce) if reduce else []
    return events


def _streams(hw, groups, segments) -> step_time.Timed:
    return step_time.Streams(hw, groups, groups.stretch, simple_fsdp_eager=False).run(segments)


def _linear(t1: step_time.Timed, t2: step_time.Timed, n: float) -> step_time.Timed:
    """t at n blocks from t at 1 and 2 (the dry run's block extrapolation, exact in time)."""
    return step_time.Timed().add(t1, 2 - n).add(t2, n - 1)


def compose(
    lay,
    m: Model,
    probes: dict,
    hw: HardwareProfile,
    *,
    seq: int,
    global_batch: int,
    states_bytes: int,
    compiled: bool,
    skew: float = 1.0,
) -> Composed:
    """The step time and peak of layout `lay` (module docstring); `probes`: AC label ->
    BlockProbe; `states_bytes`: the busiest rank's model states (model_states.py)."""
    d = lay.degrees
    pr = probes[lay.ac]
    groups = groups_of(d, hw)
    block = largest_block(m)
    costs = _block_costs(m, block, pr, lay, seq=seq, hw=hw, compiled=compiled, skew=skew)
    rest = _rest(m, pr, lay, seq, hw)
    accum = global_batch // (d.dp * lay.local_batch)
    shard = d.dp_shard * d.cp
    tokens_step = global_batch * seq
    world = d.world_size
    batch = lay.microbatch if d.pp > 1 else lay.local_batch
    tokens = batch * seq // d.cp
    blocks_rank = m.n_layers / d.pp
    # the tail (clipping, the optimizer: memory-bound over the rank's states): the probe's
    # rest, and its per-block part scaled by the rank's states in units of the probe's block
    per_block_states = 16.0 * sum(p.numel for p in block) / 2  # the probe shards over 2
    tail_s = pr.tail_s - pr.tail_block_s + pr.tail_block_s * states_bytes / per_block_states
    tail = step_time.Timed(tail_s, {"optimizer": tail_s})
    if d.pp == 1:
        reshard = lay.reshard != "never" and shard > 1
        timed = []
        for n in (1, 2):
            segs = [
                Segment("forward", None, _forward(costs, n, shard > 1, None)),
                Segment("loss", None, [dataclasses.replace(rest)]),
                Segment("backward", None, _backward(costs, n, reshard, True, None)),
            ]
            timed.append(_streams(hw, groups, segs))
        body = _linear(*timed, m.n_layers)
        step = accum * body.seconds + tail.seconds
        parts = step_time.Timed().add(body, accum).add(tail).parts
        in_flight = 1
        # gathered units (the one computing and the one prefetched, or all when kept) and
        # one unit's unsharded gradients before their reduction
        gathered = _bytes(costs.gather) * (2 if reshard else m.n_layers)
        gathered += _bytes(costs.reduce, "reduce_scatter")
    else:
        step, parts = _pipeline(
            lay, m, costs, rest, tail=tail, groups=groups, hw=hw, accum=accum, tokens=tokens
        )
        stages = 2 if lay.schedule == "Interleaved1F1B" else 1
        microbatches = lay.local_batch // lay.microbatch
        in_flight = min(microbatches, d.pp) * (1.5 if stages > 1 else 1.0)
        # kept for the step: every unit's gathered parameters and, until the reduction
        # after the last backward, its unsharded gradients
        gathered = _bytes(costs.gather) * blocks_rank
        gathered += _bytes(costs.reduce, "reduce_scatter") * blocks_rank
    # per token: A + B / tp (what TP splits and what it keeps whole, from the probes at TP 1
    # and 2), plus what CP adds per token a rank holds (attention's: split over TP's heads)
    unsplit = max(0.0, 2 * pr.kept_tp2_per_token - pr.kept_per_token)
    per_token = unsplit + (pr.kept_per_token - unsplit) / d.tp
    if d.cp > 1:
        per_token += max(0.0, pr.kept_cp2_per_token - pr.kept_per_token) / d.tp
    kept = per_token * tokens * blocks_rank * in_flight
    if d.ep > 1 and lay.ac != "full" and any(p.expert for p in block):
        # expert parallel's all-to-all buffers (the token copies routed out and back), kept
        # for backward per MoE block and microbatch in flight (op SAC keeps them too); the
        # probe runs without EP and has none
        moe_blocks = sum(1 for b in m.blocks if any(p.expert for p in b)) / d.pp
        copies = 2 * m.act_bytes * tokens / d.tp * m.top_k * m.dim * skew
        kept += copies * moe_blocks * in_flight
    transient = pr.transient_per_token * tokens / d.tp
    peak = states_bytes + kept + transient + gathered
    tps = tokens_step / step / world if step > 0 else 0.0
    return Composed(step, tps, peak, parts)


def _pipeline(lay, m: Model, costs, rest, *, tail, groups, hw, accum, tokens):
    d = lay.degrees
    per_rank = 2 if lay.schedule == "Interleaved1F1B" else 1
    n_stages = d.pp * per_rank
    n_mb = lay.local_batch // lay.microbatch
    blocks = m.n_layers / n_stages
    shard = d.dp_shard * d.cp
    every = lay.reshard == "always" and shard > 1
    kinds: dict[str, step_time.RankTimes] = {}

    def stage_times(last: bool) -> dict:
        out = {}
        extra = rest if last else None
        for kind, mb in (("F", 0), ("F", 1), ("B", 0), ("B", 1)):
            timed = []
            for n in (1, 2):
                if kind == "F":
                    ev = _forward(costs, n, shard > 1 and (mb == 0 or every), extra)
                    seg = Segment("forward", None, ev)
                else:
                    ev = _backward(costs, n, every, False, extra)
                    seg = Segment("backward", None, ev)
                timed.append(_streams(hw, groups, [seg]))
            out[(kind, mb)] = _linear(*timed, blocks)
        timed = []
        for n in (1, 2):
            ev = [e for _ in range(n) for e in costs.reduce]
            timed.append(_streams(hw, groups, [Segment("backward (gradient reduction)", None, ev)]))
        out[("R", None)] = _linear(*timed, blocks)
        return out

    kinds["mid"] = stage_times(False)
    kinds["last"] = stage_times(True)

    def run(microbatches: int) -> tuple[float, dict]:
        order = pipeline_time.order_for(lay.schedule, d.pp, microbatches)
        acts, _ = order
        times = {}
        for r, items in acts.items():
            stages = {a[0] for item in items for a in (item if isinstance(item, list) else [item])}
            actions = {}
            for s in stages:
                kind = kinds["last"] if s == n_stages - 1 else kinds["mid"]
                for (k, mb), t in kind.items():
                    actions[(s, k, mb)] = t
            p2p = step_time.collective_seconds(
                "send", m.act_bytes * tokens * m.dim, groups.ranks["pp"], hw
            )
            times[r] = step_time.RankTimes(step_time.Timed(), actions, tail, p2p)
        roles = [(f"pp{r}", [r], r) for r in times]
        shape = step_time.StepShape(
            1, d.world_size, 0.0, 0.0, accum, cpu_sharing.busy_rates(hw, d.world_size, d.pp)
        )
        got = step_time.role_times(roles, times, order, shape)
        slowest = max(got, key=lambda t: t.predicted_step_seconds)
        return slowest.predicted_step_seconds, slowest.breakdown

    if n_mb <= _EXTRAPOLATE_FROM * d.pp:
        return run(n_mb)
    # past the warm-up every microbatch adds the slowest stage's forward and backward: the
    # step is linear in the microbatches; run the schedule at 2 and 3 rounds of pp and
    # extrapolate (the event simulation of thousands of microbatches costs seconds each)
    a, b = 2 * d.pp, 3 * d.pp
    (sa, pa), (sb, pb) = run(a), run(b)
    k = (n_mb - a) / (b - a)
    parts = {key: pa.get(key, 0.0) + k * (pb.get(key, 0.0) - pa.get(key, 0.0)) for key in pa | pb}
    return sa + k * (sb - sa), parts
