"""Model states per rank, torch-free: the fp32 parameters, gradients and AdamW states one rank
holds, from a flavor's shapes and the parallel layout.

The config check (before torchrun) uses it to refuse a job whose model states alone exceed the
memory budget, in a second instead of after minutes of building. It is a floor, not a
prediction: activations, gathered (unsharded, e.g. bf16) parameters and their gradients before
reduction, communication and pipeline buffers, module buffers (RoPE cache, MoE counters) and
the allocator's slack come on top; they belong to the full prediction the workers make with torch.

Per parameter element a rank holds 16 bytes: the fp32 master parameter (4), its gradient (4,
sharded like the parameter) and AdamW's exp_avg and exp_avg_sq (4 + 4). What a rank holds of a
parameter follows the build path exactly (the unit tests compare it with the parallelized
model on a fake process group):
- tensor parallel splits the dim its plan names, as torch's ColwiseParallel / RowwiseParallel
  do (a Linear's [out, in]: column-wise dim 0, row-wise dim 1; the row-wise embeddings: the
  vocabulary, dim 0), and replicates norms, the MLA down-projections and the MoE router (the
  models' parallelize.py);
- routed experts ([E, ...] stacks) are split over expert parallel on dim 0, never over TP;
- FSDP then splits dim 0 over dp_shard x cp (routed experts: over the dp_shard ranks EP did
  not take), rank 0 holding the largest piece: ceil(n / shards) rows (FSDP2 pads every rank to
  it); DDP (dp_shard 1, cp 1) and dp_replicate keep whole copies;
- a pipeline rank holds its stages' blocks, the first stage also the embeddings, the last
  the final norm and output.
The busiest rank is the first data/tensor-parallel rank of the pipeline rank with the most.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from torchtitan.distributed.job_shape import Degrees, degrees, pipeline_microbatches
from torchtitan.distributed.pipeline_layout import PipelineLayout, plan_pipeline
from torchtitan.distributed.plan import BLOCKS

if TYPE_CHECKING:
    from torchtitan.config.job_config import JobConfig

GIB = 2**30
# Bytes per parameter element a rank keeps between steps (module docstring).
PARAM_BYTES, GRAD_BYTES, ADAMW_BYTES = 4, 4, 8

COLWISE, ROWWISE = 0, 1  # the weight dim TP splits: Linear [out, in] column-wise / row-wise
EMBEDDING_ROWWISE = 0  # RowwiseParallel on nn.Embedding [vocab, dim] splits the vocabulary


@dataclass(frozen=True)
class Param:
    """One parameter: its full shape and how the layout splits it."""

    name: str  # as model.named_parameters() calls it
    shape: tuple[int, ...]
    tp_dim: int | None = None  # the dim tensor parallel splits; None: replicated over TP
    expert: bool = False  # a routed-expert stack: expert parallel splits dim 0

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class ModelShapes:
    """A model's parameters grouped by what a pipeline stage keeps or drops as a whole."""

    first: list[Param]  # only on the first pipeline stage (embeddings)
    blocks: list[list[Param]]  # block i's parameters (named f"{BLOCKS}.{i}.")
    last: list[Param]  # only on the last stage (final norm, output)

    def all(self) -> list[Param]:
        return self.first + [p for block in self.blocks for p in block] + self.last

    def stage(self, blocks: tuple[int, ...], first: bool, last: bool) -> list[Param]:
        return (self.first if first else []) + [p for i in blocks for p in self.blocks[i]] + (self.last if last else [])


def _linear(name: str, out_dim: int, in_dim: int, tp_dim: int | None) -> Param:
    return Param(f"{name}.weight", (out_dim, in_dim), tp_dim)


def _norm(name: str, dim: int) -> Param:
    return Param(f"{name}.weight", (dim,))  # TP: sequence parallel or replicated, never split


def _swiglu(name: str, dim: int, hidden: int) -> list[Param]:
    """common.feed_forward.FeedForward under common.tensor_parallel.feed_forward_sharding."""
    return [_linear(f"{name}.w1", hidden, dim, COLWISE), _linear(f"{name}.w2", dim, hidden, ROWWISE),
            _linear(f"{name}.w3", hidden, dim, COLWISE)]


def _ends(args) -> tuple[list[Param], list[Param]]:
    """Embeddings (first stage) and final norm + output (last stage), per common.tensor_parallel.
    root_sharding: embeddings row-wise, output column-wise."""
    first = [Param("tok_embeddings.weight", (args.vocab_size, args.dim), EMBEDDING_ROWWISE)]
    last = [_norm("norm", args.dim), _linear("output", args.vocab_size, args.dim, COLWISE)]
    return first, last


def llama3_shapes(args) -> ModelShapes:
    """models/llama3/model.py, TP as in models/llama3/parallelize.py."""
    hd = args.head_dim

    def block(i: int) -> list[Param]:
        b = f"{BLOCKS}.{i}"
        return [
            _norm(f"{b}.attention_norm", args.dim),
            _linear(f"{b}.attention.wq", args.n_heads * hd, args.dim, COLWISE),
            _linear(f"{b}.attention.wk", args.n_kv_heads * hd, args.dim, COLWISE),
            _linear(f"{b}.attention.wv", args.n_kv_heads * hd, args.dim, COLWISE),
            _linear(f"{b}.attention.wo", args.dim, args.n_heads * hd, ROWWISE),
            _norm(f"{b}.ffn_norm", args.dim),
            *_swiglu(f"{b}.feed_forward", args.dim, args.ffn_hidden_dim),
        ]

    first, last = _ends(args)
    return ModelShapes(first, [block(i) for i in range(args.n_layers)], last)


def deepseek_v3_shapes(args) -> ModelShapes:
    """models/deepseek_v3/model.py (MLA; dense FFN, then MoE blocks), TP as in
    models/deepseek_v3/parallelize.py (LoRA down-projections, their norms and the router whole)."""

    def attention(a: str) -> list[Param]:
        n, qk = args.n_heads, args.qk_head_dim
        if args.q_lora_rank == 0:
            q = [_linear(f"{a}.wq", n * qk, args.dim, COLWISE)]
        else:
            q = [_linear(f"{a}.wq_a", args.q_lora_rank, args.dim, None), _norm(f"{a}.q_norm", args.q_lora_rank),
                 _linear(f"{a}.wq_b", n * qk, args.q_lora_rank, COLWISE)]
        return q + [
            _linear(f"{a}.wkv_a", args.kv_lora_rank + args.qk_rope_head_dim, args.dim, None),
            _norm(f"{a}.kv_norm", args.kv_lora_rank),
            _linear(f"{a}.wkv_b", n * (args.qk_nope_head_dim + args.v_head_dim), args.kv_lora_rank, COLWISE),
            _linear(f"{a}.wo", args.dim, n * args.v_head_dim, ROWWISE),
        ]

    def moe(m: str) -> list[Param]:
        e, h = args.n_routed_experts, args.moe_inter_dim
        experts = [Param(f"{m}.experts.w1", (e, h, args.dim), expert=True),
                   Param(f"{m}.experts.w2", (e, args.dim, h), expert=True),
                   Param(f"{m}.experts.w3", (e, h, args.dim), expert=True)]
        shared = _swiglu(f"{m}.shared_experts", args.dim, h * args.n_shared_experts) if args.n_shared_experts else []
        return [_linear(f"{m}.router.gate", e, args.dim, None), *experts, *shared]

    def block(i: int, b: str = "") -> list[Param]:
        b = b or f"{BLOCKS}.{i}"
        ffn = moe(f"{b}.moe") if i >= args.n_dense_layers else _swiglu(f"{b}.feed_forward", args.dim, args.inter_dim)
        return [_norm(f"{b}.attention_norm", args.dim), *attention(f"{b}.attention"),
                _norm(f"{b}.ffn_norm", args.dim), *ffn]

    def mtp(k: int) -> list[Param]:
        """Multi-token-prediction depth k (last stage): norms, eh_proj (TP keeps it whole) and
        block n_layers + k."""
        m = f"mtp.{k}"
        return [_norm(f"{m}.enorm", args.dim), _norm(f"{m}.hnorm", args.dim),
                _linear(f"{m}.eh_proj", args.dim, 2 * args.dim, None), *block(args.n_layers + k, f"{m}.block"),
                _norm(f"{m}.norm", args.dim)]

    first, last = _ends(args)
    last += [p for k in range(getattr(args, "mtp_depth", 0)) for p in mtp(k)]
    return ModelShapes(first, [block(i) for i in range(args.n_layers)], last)


# Model name (models/registry.py) -> its shapes; a unit test checks that every registered model
# has an entry and that it matches the model built on meta, parameter by parameter.
MODEL_SHAPES: dict[str, Callable[..., ModelShapes]] = {
    "llama3": llama3_shapes,
    "deepseek_v3": deepseek_v3_shapes,
}


def model_shapes(name: str, args) -> ModelShapes:
    """`args` with its vocab_size resolved (flavors.model_args)."""
    if not args.vocab_size:
        raise ValueError(f"{name}: vocab_size 0 (the tokenizer's) must be resolved first (flavors.model_args)")
    return MODEL_SHAPES[name](args)


def local_numel(p: Param, d: Degrees) -> int:
    """Elements of `p` the busiest rank holds (module docstring)."""
    shape = list(p.shape)
    if p.expert:
        shape[0] //= d.ep  # check_expert_parallel makes ep divide the experts
        fsdp = d.dp_shard // d.ep_from_dp_shard  # the dp_shard ranks EP did not take
    else:
        if p.tp_dim is not None:
            shape[p.tp_dim] = -(-shape[p.tp_dim] // d.tp)
        fsdp = d.fsdp_shard  # dp_shard x cp
    shape[0] = -(-shape[0] // fsdp)
    return math.prod(shape)


@dataclass(frozen=True)
class RankStates:
    """The model states of one pipeline rank's busiest data/tensor-parallel rank."""

    pp_rank: int
    stage_ids: tuple[int, ...]
    num_stages: int
    numel: int  # parameter elements held

    @property
    def params_bytes(self) -> int:
        return PARAM_BYTES * self.numel

    @property
    def grads_bytes(self) -> int:
        return GRAD_BYTES * self.numel

    @property
    def optimizer_bytes(self) -> int:
        return ADAMW_BYTES * self.numel

    @property
    def total_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes

    def where(self) -> str:
        """'pipeline stage 3 of 4', or 'pipeline stages 0 and 7 of 8 (pipeline rank 0 of 4)'."""
        ids = self.stage_ids
        if len(ids) == 1:
            return f"pipeline stage {ids[0]} of {self.num_stages}"
        listed = ", ".join(map(str, ids[:-1])) + f" and {ids[-1]}"
        return f"pipeline stages {listed} of {self.num_stages} (pipeline rank {self.pp_rank})"


def rank_states(shapes: ModelShapes, d: Degrees, layout: PipelineLayout | None) -> list[RankStates]:
    """One RankStates per pipeline rank (one without PP)."""
    if layout is None:
        return [RankStates(0, (0,), 1, sum(local_numel(p, d) for p in shapes.all()))]
    out = []
    for pp_rank in range(layout.pp):
        ids = tuple(layout.stage_ids(pp_rank))
        params = [p for s in ids for p in shapes.stage(layout.stages[s], s == 0, s == layout.num_stages - 1)]
        out.append(RankStates(pp_rank, ids, layout.num_stages, sum(local_numel(p, d) for p in params)))
    return out


def busiest(ranks: list[RankStates]) -> RankStates:
    """The rank holding the most model states (the first such pipeline rank on a tie)."""
    return max(ranks, key=lambda r: r.numel)


def job_rank_states(cfg: JobConfig, world_size: int, args) -> list[RankStates]:
    """rank_states of a (validated) job: its degrees and pipeline split; `args` as the run builds
    the model (flavors.model_args, vocabulary resolved)."""
    d = degrees(cfg, world_size)
    p = cfg.parallelism
    layout = None
    if d.pp > 1:
        layout = plan_pipeline(args.n_layers, d.pp, p.pipeline_parallel_schedule, p.pipeline_parallel_layers_per_stage,
                               p.pipeline_parallel_split_points, pipeline_microbatches(cfg))
    return rank_states(model_shapes(cfg.model.name, args), d, layout)


def gib(n_bytes: float) -> str:
    """1,953.1: GiB with one decimal and thousands separators."""
    return f"{n_bytes / GIB:,.1f}"
