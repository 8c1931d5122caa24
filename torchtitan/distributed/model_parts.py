"""The one build path, from the whole model on meta to a rank's parallelized model parts:
pipeline split -> FSDP units -> the plan (reshard decisions resolved once over all of the
rank's stages, AC regions) -> the model's parallelize function per part (TP -> AC ->
compile -> data parallel). The trainer, the dry run and the scripts all call `build_parts`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch import nn

from torchtitan.distributed import reshard_policy
from torchtitan.distributed.activation_checkpoint import region_specs
from torchtitan.distributed.data_parallel import size_units
from torchtitan.distributed.job_shape import pipeline_microbatches
from torchtitan.distributed.parallel_dims import ParallelDims
from torchtitan.distributed.pipeline_layout import PipelineLayout, plan_pipeline
from torchtitan.distributed.pipeline_parallel import split_model
from torchtitan.distributed.plan import BLOCKS, FsdpUnit, PartPlan, RegionSpec
from torchtitan.dtypes import dtype_bytes, param_dtype

if TYPE_CHECKING:
    from torchtitan.config.job_config import JobConfig
    from torchtitan.protocols.train_spec import TrainSpec


@dataclass
class ModelPart:
    """One model part (the whole model, or one pipeline stage) and its plan."""

    module: nn.Module
    plan: PartPlan

    @property
    def stage_id(self) -> int:
        return self.plan.stage_id


@dataclass
class ModelParts:
    """What one rank holds: its parts in pipeline order, the layout they come from."""

    parts: list[ModelPart]
    layout: PipelineLayout | None
    microbatches: int
    param_dtype: str  # the parameters' compute dtype ("float32", "bfloat16")

    @property
    def stage_ids(self) -> list[int]:
        return [p.stage_id for p in self.parts]

    @property
    def modules(self) -> list[nn.Module]:
        return [p.module for p in self.parts]

    @property
    def plans(self) -> list[PartPlan]:
        return [p.plan for p in self.parts]


def pipeline_layout(cfg: JobConfig, dims: ParallelDims, n_layers: int) -> PipelineLayout | None:
    if dims.pp == 1:
        return None
    p = cfg.parallelism
    return plan_pipeline(
        n_layers, dims.pp, p.pipeline_parallel_schedule, p.pipeline_parallel_layers_per_stage,
        p.pipeline_parallel_split_points, pipeline_microbatches(cfg),
    )


def _regions(cfg: JobConfig, units: list[FsdpUnit], flags: dict[str, bool], simple: bool) -> dict[str, RegionSpec]:
    """AC regions of one part: one per block; under SimpleFSDP also one around each resharded
    unit outside any block (e.g. embeddings), whose gathers must be redone in backward."""
    blocks = list(dict.fromkeys(u.block for u in units if u.block is not None))
    specs = region_specs(cfg.activation_checkpoint, blocks, flags, simple, cfg.compile.enable)
    outside = {u.name: RegionSpec("none", "recompute", by_hooks=True) for u in units  # never compiled
               if simple and u.block is None and not u.is_root and flags[u.name]}
    return {**outside, **specs}


def resolve_parts(spec: TrainSpec, model: nn.Module, dims: ParallelDims, cfg: JobConfig, param_dtype: str,
                  pp_rank: int, free_bytes: int = 0, budget_note: str = "") -> ModelParts:
    """Split (on meta) and plan, without parallelizing: what pipeline rank `pp_rank` holds.
    `free_bytes`: kept unsharded bytes the memory budget makes auto free (torchtitan/memory)."""
    layout = pipeline_layout(cfg, dims, len(getattr(model, BLOCKS)))
    split = split_model(model, layout, pp_rank) if layout is not None else [(0, model)]
    units = [size_units(m, dims.tp, dims.ep, dtype_bytes(param_dtype), spec.tp_replicated) for _, m in split]
    p = cfg.parallelism
    microbatches = pipeline_microbatches(cfg)
    decisions = reshard_policy.resolve(
        p.reshard_after_forward, dims.pp > 1, p.pipeline_parallel_schedule, microbatches,
        units, free_bytes, budget_note,
    )
    simple = p.fsdp_implementation == "simple_fsdp" and dims.dp_shard > 1
    parts = []
    for (stage_id, module), part_units, decided in zip(split, units, decisions):
        flags = {name: d.reshard for name, d in decided.items()}
        plan = PartPlan.assemble(stage_id, part_units, decided, _regions(cfg, part_units, flags, simple), microbatches)
        parts.append(ModelPart(module, plan))
    return ModelParts(parts, layout, microbatches, param_dtype)


def build_parts(spec: TrainSpec, model: nn.Module, dims: ParallelDims, cfg: JobConfig, device_type: str,
                pp_rank: int, free_bytes: int = 0, budget_note: str = "") -> ModelParts:
    """What pipeline rank `pp_rank` trains, planned and parallelized, still on meta. The
    parameter dtype follows the device the job targets (`device_type`)."""
    parts = resolve_parts(spec, model, dims, cfg, param_dtype(cfg.training.mixed_precision_param, device_type),
                          pp_rank, free_bytes, budget_note)
    for part in parts.parts:
        part.module = spec.parallelize_fn(part.module, dims, cfg, part.plan, parts.param_dtype)
    return parts


def plan_records(parts: ModelParts) -> list[dict]:
    """The plan.json `model_parts` entries of these parts."""
    return [plan.record() for plan in parts.plans]
