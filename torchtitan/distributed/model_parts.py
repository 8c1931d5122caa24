"""From the whole model on meta to this rank's parallelized model parts:
pipeline split -> FSDP units -> the reshard plan (resolved once, over all of the rank's
stages) -> the model's parallelize function per part. Shared by the trainer and the dry run.
"""

from dataclasses import dataclass

from torch import nn

from torchtitan.distributed import reshard_policy
from torchtitan.distributed.activation_checkpoint import RegionSpec, region_specs
from torchtitan.distributed.data_parallel import DTYPE_BYTES
from torchtitan.distributed.pipeline_layout import PipelineLayout, plan_pipeline
from torchtitan.distributed.reshard_policy import GIB, Decision, Unit


@dataclass
class ModelPart:
    """One model part (the whole model, or one pipeline stage) and everything decided for it
    before it is parallelized."""

    stage_id: int
    module: nn.Module
    units: list[Unit]  # FSDP units in forward order
    reshard: dict[str, Decision]  # unit name -> reshard_after_forward and why
    regions: dict[str, RegionSpec]  # checkpoint region (a block, or a unit outside blocks) -> what it does
    microbatches: int = 1  # forward/backward passes per pipeline step (1 without PP)

    @property
    def reshard_flags(self) -> dict[str, bool]:
        return {name: d.reshard for name, d in self.reshard.items()}


@dataclass
class ModelParts:
    parts: list[ModelPart]
    layout: PipelineLayout | None
    n_microbatches: int

    @property
    def stage_ids(self) -> list[int]:
        return [p.stage_id for p in self.parts]

    @property
    def modules(self) -> list[nn.Module]:
        return [p.module for p in self.parts]


def n_microbatches(cfg, dims) -> int:
    if dims.pp == 1:
        return 1
    return cfg.training.local_batch_size // cfg.parallelism.pipeline_parallel_microbatch_size


def pipeline_layout(cfg, dims, n_layers: int) -> PipelineLayout | None:
    if dims.pp == 1:
        return None
    p = cfg.parallelism
    return plan_pipeline(
        n_layers, dims.pp, p.pipeline_parallel_schedule, p.pipeline_parallel_layers_per_stage,
        p.pipeline_parallel_split_points, n_microbatches(cfg, dims),
    )


def _regions(cfg, units: list[Unit], flags: dict[str, bool], simple: bool) -> dict[str, RegionSpec]:
    """AC regions of one part: one per block; under SimpleFSDP also one around each resharded
    unit outside any block (e.g. embeddings), whose gathers must be redone in backward."""
    blocks = list(dict.fromkeys(u.block for u in units if u.block is not None))
    specs = region_specs(cfg.activation_checkpoint, blocks, flags, simple, cfg.compile.enable)
    outside = {u.name: RegionSpec("none", "recompute", by_hooks=True) for u in units  # never compiled
               if simple and u.block is None and not u.is_root and flags[u.name]}
    return {**outside, **specs}


def resolve_parts(spec, model: nn.Module, dims, cfg, param_dtype: str, pp_rank: int) -> ModelParts:
    """Split (on meta) and plan, without parallelizing: what pipeline rank `pp_rank` holds."""
    layout = pipeline_layout(cfg, dims, model.args.n_layers)
    split = spec.pipeline_fn(model, layout, pp_rank) if layout is not None else [(0, model)]
    units = [spec.fsdp_units_fn(m, dims, DTYPE_BYTES[param_dtype]) for _, m in split]
    p = cfg.parallelism
    plan = reshard_policy.resolve(
        p.reshard_after_forward, dims.pp > 1, p.pipeline_parallel_schedule, n_microbatches(cfg, dims),
        units, int(p.reshard_budget_gib * GIB),
    )
    simple = p.fsdp_implementation == "simple_fsdp" and dims.dp_shard > 1
    parts = []
    for (stage_id, module), part_units, decisions in zip(split, units, plan):
        flags = {name: d.reshard for name, d in decisions.items()}
        parts.append(ModelPart(stage_id, module, part_units, decisions, _regions(cfg, part_units, flags, simple),
                               n_microbatches(cfg, dims)))
    return ModelParts(parts, layout, n_microbatches(cfg, dims))


def parallelize_parts(spec, parts: ModelParts, dims, cfg, param_dtype: str) -> None:
    """TP -> AC -> compile -> data parallel on every part, with its slice of the plan."""
    for part in parts.parts:
        part.module = spec.parallelize_fn(part.module, dims, cfg, param_dtype, part)


def plan_records(parts: ModelParts) -> list[dict]:
    """The plan.json `model_parts` entries of these parts. A unit's mesh is named only when
    it is not the dense data-parallel one (experts)."""
    return [
        {
            "stage": part.stage_id,
            "fsdp_units": [
                {"name": u.name or "<root>", "reshard_after_forward": part.reshard[u.name].reshard,
                 "reason": part.reshard[u.name].reason, "param_bytes": u.param_bytes,
                 **({"mesh": u.mesh} if u.mesh != "dp" else {})}
                for u in part.units
            ],
            "ac_regions": [{"name": name, "mode": spec.compute, "fsdp_ac_policy": spec.fsdp_comm or "n/a",
                            "label": spec.label} for name, spec in part.regions.items()],
        }
        for part in parts.parts
    ]
