"""From the whole model on meta to this rank's parallelized model parts:
pipeline split -> FSDP units -> the reshard plan (resolved once, over all of the rank's
stages) -> the model's parallelize function per part. Shared by the trainer and the dry run.
"""

from dataclasses import dataclass

from torch import nn

from torchtitan.config.job_config import JobConfig
from torchtitan.distributed import reshard_policy
from torchtitan.distributed.activation_checkpoint import RegionSpec, region_specs
from torchtitan.distributed.parallel_dims import ParallelDims
from torchtitan.distributed.pipeline_layout import PipelineLayout, plan_pipeline
from torchtitan.distributed.reshard_policy import GIB, Decision, Unit

DTYPE_BYTES = {"float32": 4, "bfloat16": 2}


@dataclass
class PartPlan:
    """Everything decided for one model part before it is parallelized."""

    reshard: dict[str, Decision]  # FSDP unit -> reshard_after_forward
    regions: dict[str, RegionSpec]  # checkpoint region (block, or embeddings) -> what it does

    @property
    def reshard_flags(self) -> dict[str, bool]:
        return {name: d.reshard for name, d in self.reshard.items()}


@dataclass
class ModelParts:
    stage_ids: list[int]
    modules: list[nn.Module]
    units: list[list[Unit]]
    plan: list[dict[str, Decision]]
    layout: PipelineLayout | None
    n_microbatches: int
    regions: list[dict[str, RegionSpec]]


def n_microbatches(cfg: JobConfig, dims: ParallelDims) -> int:
    if dims.pp == 1:
        return 1
    return cfg.training.local_batch_size // cfg.parallelism.pipeline_parallel_microbatch_size


def pipeline_layout(cfg: JobConfig, dims: ParallelDims, n_layers: int) -> PipelineLayout | None:
    if dims.pp == 1:
        return None
    p = cfg.parallelism
    return plan_pipeline(
        n_layers, dims.pp, p.pipeline_parallel_schedule, p.pipeline_parallel_layers_per_stage,
        p.pipeline_parallel_split_points, n_microbatches(cfg, dims),
    )


def resolve_parts(spec, model: nn.Module, dims: ParallelDims, cfg: JobConfig, param_dtype: str, pp_rank: int) -> ModelParts:
    """Split (on meta) and plan, without parallelizing: what pipeline rank `pp_rank` holds."""
    layout = pipeline_layout(cfg, dims, model.args.n_layers)
    parts = spec.pipeline_fn(model, layout, pp_rank) if layout is not None else [(0, model)]
    units = [spec.fsdp_units_fn(m, dims.tp, DTYPE_BYTES[param_dtype]) for _, m in parts]
    p = cfg.parallelism
    plan = reshard_policy.resolve(
        p.reshard_after_forward, dims.pp > 1, p.pipeline_parallel_schedule, n_microbatches(cfg, dims),
        units, int(p.reshard_budget_gib * GIB),
    )
    simple = p.fsdp_implementation == "simple_fsdp" and dims.dp_shard > 1
    regions = []
    for part_units, decisions in zip(units, plan):
        flags = {name: d.reshard for name, d in decisions.items()}
        blocks = [u.name for u in part_units if u.name.startswith("layers.")]
        specs = region_specs(cfg.activation_checkpoint, blocks, flags, simple)
        if simple and flags.get("tok_embeddings"):  # resharded embeddings re-gather in backward
            specs = {"tok_embeddings": RegionSpec("none", "recompute"), **specs}
        regions.append(specs)
    return ModelParts([sid for sid, _ in parts], [m for _, m in parts], units, plan, layout,
                      n_microbatches(cfg, dims), regions)


def parallelize_parts(spec, parts: ModelParts, dims: ParallelDims, cfg: JobConfig, param_dtype: str) -> None:
    """TP -> AC -> compile -> data parallel on every part, with its slice of the plan."""
    parts.modules = [
        spec.parallelize_fn(module, dims, cfg, param_dtype, PartPlan(decisions, regions))
        for module, decisions, regions in zip(parts.modules, parts.plan, parts.regions)
    ]


def plan_records(parts: ModelParts) -> list[dict]:
    """The plan.json `model_parts` entries of these parts."""
    return [
        {
            "stage": sid,
            "fsdp_units": [
                {"name": u.name or "<root>", "reshard_after_forward": d[u.name].reshard,
                 "reason": d[u.name].reason, "param_bytes": u.param_bytes}
                for u in units
            ],
            "ac_regions": [{"name": name, "mode": spec.compute, "fsdp_ac_policy": spec.fsdp_comm or "n/a",
                            "label": spec.label} for name, spec in regions.items()],
        }
        for sid, units, d, regions in zip(parts.stage_ids, parts.units, parts.plan, parts.regions)
    ]
