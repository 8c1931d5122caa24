"""The one build path. The trainer, the dry run, the memory simulation, the start-up check and
the scripts all build here, from the job as one value (training/planned_job.py's PlannedJob:
its config, its model on meta, its degrees, its target device):

- `model_on_meta` (planned_job.py): the job's model on meta, with the args the run takes
  (training/model_args.py);
- `build_parts`: what one pipeline rank trains: pipeline split -> FSDP units -> the plan
  (reshard decisions resolved once over all of the rank's stages, AC regions) -> the model's
  parallelize function per part (TP -> AC -> compile -> data parallel), still on meta;
- `step_runner`: the loss, the pipeline schedule over the parts (PP) and the StepRunner;
- `fake_world`: the fake process group and mesh of a job's world size, in this one process
  (the dry run and the memory prediction).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from torchtitan.distributed import reshard_policy
from torchtitan.distributed.activation_checkpoint import configure_checkpointing, region_specs
from torchtitan.distributed.context_parallel import configured
from torchtitan.distributed.data_parallel import Precision, size_units
from torchtitan.distributed.parallel_dims import ParallelDims
from torchtitan.distributed.pipeline_layout import PipelineLayout
from torchtitan.distributed.pipeline_parallel import build_pipeline, split_model
from torchtitan.distributed.plan import FsdpUnit, PartPlan, RegionSpec
from torchtitan.dtypes import dtype_bytes, param_dtype
from torchtitan.models.common.attn_backend import run_attn_mask
from torchtitan.models.common.moe import moe_modules
from torchtitan.training.loss import Loss
from torchtitan.training.phases import StepPhase
from torchtitan.training.planned_job import MetaModel as MetaModel  # re-exported (importers)
from torchtitan.training.planned_job import PlannedJob
from torchtitan.training.planned_job import model_on_meta as model_on_meta  # re-exported
from torchtitan.training.step import StepRunner

if TYPE_CHECKING:
    from torchtitan.config.job_config import JobConfig


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
    precision: Precision  # the parameters' compute dtype and the gradients' reduce dtype

    @property
    def param_dtype(self) -> str:
        return self.precision.param

    @property
    def stage_ids(self) -> list[int]:
        return [p.stage_id for p in self.parts]

    @property
    def modules(self) -> list[nn.Module]:
        return [p.module for p in self.parts]

    @property
    def plans(self) -> list[PartPlan]:
        return [p.plan for p in self.parts]


logger = logging.getLogger(__name__)
_NOTED: set[str] = set()


def note_once(line: str) -> None:
    """Log a `note:` line once per process (every step runner of a run would repeat it)."""
    if line not in _NOTED:
        _NOTED.add(line)
        logger.info(line)


def _regions(
    cfg: JobConfig, units: list[FsdpUnit], flags: dict[str, bool], simple: bool
) -> dict[str, RegionSpec]:
    """AC regions of one part: one per block; under SimpleFSDP also one around each resharded
    unit outside any block (e.g. embeddings), whose gathers must be redone in backward."""
    blocks = list(dict.fromkeys(u.block for u in units if u.block is not None))
    compiled = cfg.compile.enable and "model" in cfg.compile.components
    specs = region_specs(cfg.activation_checkpoint, blocks, flags, simple, compiled)
    outside = {
        u.name: RegionSpec("none", "recompute", by_hooks=True)
        for u in units  # never compiled
        if simple and u.block is None and not u.is_root and flags[u.name]
    }
    return {**outside, **specs}


def precision(cfg: JobConfig, device_type: str) -> Precision:
    """The parameters' compute dtype on the device the job targets ("auto": dtypes.param_dtype),
    the gradients' reduce dtype, and whether FSDP2 keeps the states on the host."""
    t = cfg.training
    return Precision(
        # training.dtype=bfloat16 (no FSDP sharding): the parameters are bf16 themselves
        "bfloat16" if t.dtype == "bfloat16" else param_dtype(t.mixed_precision_param, device_type),
        t.mixed_precision_reduce,
        cpu_offload=t.enable_cpu_offload,
    )


def resolve_parts(
    job: PlannedJob, pp_rank: int, *, free_bytes: int = 0, budget_note: str = ""
) -> ModelParts:
    """Split (on meta) and plan, without parallelizing: what pipeline rank `pp_rank` holds.
    `free_bytes`: kept unsharded bytes the memory budget makes auto free (torchtitan/memory)."""
    cfg, model, dims, spec = job.cfg, job.model, job.dims, job.spec
    mixed = precision(cfg, job.target)
    layout = job.layout
    split = split_model(model, layout, pp_rank) if layout is not None else [(0, model)]
    units = [
        size_units(m, dims.tp, dims.expert_shards, dtype_bytes(mixed.param), spec.tp_replicated)
        for _, m in split
    ]
    p = cfg.parallelism
    microbatches = job.microbatches
    decisions = reshard_policy.resolve(
        p.reshard_after_forward,
        dims.pp > 1,
        p.pipeline_parallel_schedule,
        microbatches,
        units,
        free_bytes=free_bytes,
        budget_note=budget_note,
    )
    simple = p.fsdp_implementation == "simple_fsdp" and dims.dp_shard > 1
    parts = []
    for (stage_id, module), part_units, decided in zip(split, units, decisions):
        flags = {name: d.reshard for name, d in decided.items()}
        plan = PartPlan.assemble(
            stage_id, part_units, decided, _regions(cfg, part_units, flags, simple), microbatches
        )
        parts.append(ModelPart(module, plan))
    return ModelParts(parts, layout, microbatches, mixed)


def build_parts(
    job: PlannedJob, pp_rank: int, *, free_bytes: int = 0, budget_note: str = ""
) -> ModelParts:
    """What pipeline rank `pp_rank` of `job` trains, planned and parallelized, still on meta.
    The parameter dtype follows the device the job targets (`job.target`)."""
    parts = resolve_parts(job, pp_rank, free_bytes=free_bytes, budget_note=budget_note)
    cfg = job.cfg
    configure_checkpointing(cfg.activation_checkpoint, cfg.job.dump_folder)  # torch's AC knobs
    for part in parts.parts:
        part.module = job.spec.parallelize_fn(
            part.module,
            job.dims,
            part.plan,
            parallelism=cfg.parallelism,
            compile_cfg=cfg.compile,
            precision=parts.precision,
        )
        for layer in moe_modules(part.module):  # debug.moe_force_load_balance: round-robin
            layer.force_load_balance = cfg.debug.moe_force_load_balance
        if job.dims.cp > 1:  # the rotate method and balancer the job names (parallelism keys)
            part.module.context_parallel = configured(part.module.context_parallel, cfg.parallelism)
    return parts


def plan_records(parts: ModelParts) -> list[dict]:
    """The plan.json `model_parts` entries of these parts."""
    return [plan.record() for plan in parts.plans]


def step_runner(
    parts: ModelParts,
    job: PlannedJob,
    device: torch.device,
    *,
    doc_delimiter: tuple[int, bool] | None,
    held_for_backward: bool = False,
    on_phase: Callable[[StepPhase], None] | None = None,
    backward_phase: Callable[[], AbstractContextManager] | None = None,
) -> StepRunner:
    """The loss, the pipeline schedule over the parts (under PP) and the runner of a rank's
    steps. `doc_delimiter`: the tokenizer's
    (BOS id, True) or, without BOS, (EOS id, False), used under the block-causal mask; `on_phase`,
    `backward_phase`: the memory simulation's and comm stats' phase marks."""
    cfg, dims = job.cfg, job.dims
    t, p = cfg.training, cfg.parallelism
    accum = job.batch.accum_steps
    loss = Loss(
        parts.microbatches * accum,
        cfg.model.mtp_depth,
        t.mtp_loss_weight,
        t.seq_len,
        p.context_parallel_degree,
    )
    if cfg.compile.enable and "loss" in cfg.compile.components:
        if dims.tp > 1 and p.loss_parallel:
            # torch 2.13: the compiled loss over vocabulary-sharded DTensor logits names a TP
            # group another stage's ranks do not have (measured: PP 2 x TP 2, "Could not
            # resolve the process group"); the loss-parallel loss runs eager
            note_once(
                "note: compile.components 'loss' with loss_parallel under TP: the loss runs eager"
            )
        else:
            loss.compile(cfg.compile.backend)
    pipeline = None
    if parts.layout is not None:
        pipeline = build_pipeline(
            list(zip(parts.stage_ids, parts.modules)),
            parts.layout,
            device,
            dims.pp_group(),
            parts.microbatches,
            loss_fn=loss,
            backward_phase=backward_phase,
        )
    return StepRunner(
        parts.modules,
        device,
        accum,
        loss,
        dims.tp > 1 and p.loss_parallel,
        pipeline,
        parts.layout,
        parts.stage_ids,
        held_for_backward,
        on_phase,
        doc_delimiter=doc_delimiter
        if run_attn_mask(cfg.model.attn_mask, job.args) == "block_causal"
        else None,
        cp=parts.modules[0].context_parallel,
    )


@contextlib.contextmanager
def fake_world(cfg: JobConfig, world_size: int) -> Iterator[ParallelDims]:
    """This process as rank 0 of a fake process group of `world_size` ranks (collectives move
    nothing), with the job's mesh built on it; destroyed on exit. A process can hold it only
    while no real group exists (device meshes and groups keep global state)."""
    # the fake backend needs a store only to initialise; torch's in-memory HashStore serves
    dist.init_process_group("fake", store=dist.HashStore(), rank=0, world_size=world_size)
    try:
        dims = ParallelDims.from_config(cfg, world_size)
        dims.build_mesh("cpu")
        yield dims
    finally:
        dist.destroy_process_group()
