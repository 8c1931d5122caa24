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
- tensor and expert parallel split what each model's shapes.py says (models/shapes.py);
  expert tensor parallel (etp = tp) also splits each routed expert's hidden units;
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
from typing import TYPE_CHECKING

from torchtitan.distributed.job_shape import Degrees, degrees, pipeline_microbatches
from torchtitan.distributed.pipeline_layout import PipelineLayout, pipeline_layout
from torchtitan.models.registry import model_entry
from torchtitan.models.shapes import ModelShapes, Param

if TYPE_CHECKING:
    from torchtitan.config.job_config import JobConfig

# Bytes per parameter element a rank keeps between steps (module docstring).
PARAM_BYTES, GRAD_BYTES, ADAMW_BYTES = 4, 4, 8


def model_shapes(name: str, args) -> ModelShapes:
    """The registered model's shapes (its shapes.py), `args` with vocab_size resolved
    (flavors.model_args)."""
    if not args.vocab_size:
        raise ValueError(
            f"{name}: vocab_size 0 (the tokenizer's) must be resolved first (flavors.model_args)"
        )
    return model_entry(name).module("shapes").shapes(args)


def local_numel(p: Param, d: Degrees) -> int:
    """Elements of `p` the busiest rank holds (module docstring)."""
    shape = list(p.shape)
    if p.expert:
        shape[0] //= d.ep  # check_expert_parallel makes ep divide the experts
        if d.etp > 1:  # expert TP: w1 / w3 [E, hidden, dim] and w2 [E, dim, hidden] split on hidden
            hidden = 2 if p.name.endswith(".w2") else 1
            shape[hidden] //= d.etp
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
        params = [
            p
            for s in ids
            for p in shapes.stage(layout.stages[s], s == 0, s == layout.num_stages - 1)
        ]
        out.append(
            RankStates(pp_rank, ids, layout.num_stages, sum(local_numel(p, d) for p in params))
        )
    return out


def busiest(ranks: list[RankStates]) -> RankStates:
    """The rank holding the most model states (the first such pipeline rank on a tie)."""
    return max(ranks, key=lambda r: r.numel)


def job_rank_states(cfg: JobConfig, world_size: int, args) -> list[RankStates]:
    """rank_states of a (validated) job: its degrees and pipeline split; `args` as the run builds
    the model (flavors.model_args, vocabulary resolved)."""
    d = degrees(cfg, world_size)
    layout = pipeline_layout(cfg.parallelism, args.n_layers, pipeline_microbatches(cfg))
    return rank_states(model_shapes(cfg.model.name, args), d, layout)
