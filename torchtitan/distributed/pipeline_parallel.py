"""Pipeline parallel: cut a model (on meta) into stage modules and build the schedule.

A stage is a deep copy of the whole model with the blocks of other stages deleted from its
`layers` ModuleDict, and with the first-stage modules (embeddings) or last-stage modules
(norm, output) set to None elsewhere. Kept blocks keep their names (layers.5 stays layers.5),
so weight init, checkpoints and plans name parameters identically in every layout.
"""

import contextlib
import copy
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
from torch import nn
from torch.distributed import ProcessGroup
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    PipelineScheduleSingle,
    _PipelineSchedule,
    _PipelineScheduleRuntime,
    get_schedule_class,
)

from torchtitan.distributed.pipeline_layout import (
    FQNS_KEY,
    V_SCHEDULES,
    PipelineLayout,
    PipelineLayoutError,
)
from torchtitan.distributed.plan import BLOCKS


def split_model(
    model: nn.Module, layout: PipelineLayout, pp_rank: int
) -> list[tuple[int, nn.Module]]:
    """(stage id, stage module) for each stage this pipeline rank holds. `model` follows
    models.protocol.TrainableModel: blocks in `.layers`, and the modules only the first /
    last stage keeps in `.first_stage_modules` / `.last_stage_modules`."""
    _check_stage_modules(model, layout)
    parts = []
    for stage_id in layout.stage_ids(pp_rank):
        keep = {str(i) for i in layout.stages[stage_id]}
        # what the stage drops is not copied (the memo maps it to itself; deleted below):
        # copying a 671B model's 61 blocks for each 4-block stage took most of the split
        dropped = [m for name, m in getattr(model, BLOCKS).items() if name not in keep]
        dropped += [getattr(model, n) for n in model.first_stage_modules if stage_id != 0]
        dropped += [
            getattr(model, n) for n in model.last_stage_modules if stage_id != layout.num_stages - 1
        ]
        part = copy.deepcopy(model, {id(m): m for m in dropped if m is not None})
        blocks = getattr(part, BLOCKS)
        for name in list(blocks.keys()):
            if name not in keep:
                del blocks[name]
        if stage_id != 0:
            for name in model.first_stage_modules:
                setattr(part, name, None)
        if stage_id != layout.num_stages - 1:
            for name in model.last_stage_modules:
                setattr(part, name, None)
        parts.append((stage_id, part))
    return parts


def _check_stage_modules(model: nn.Module, layout: PipelineLayout) -> None:
    """The non-block names module_fqns_per_model_part gives the first / last part must be the
    model's first / last stage modules. Those go to their end stage even when left unnamed
    (no stage runs without the embedding or the output)."""
    for names, own, where in (
        (layout.first_modules, model.first_stage_modules, "first"),
        (layout.last_modules, model.last_stage_modules, "last"),
    ):
        wrong = [n for n in names if n not in own]
        if wrong:
            raise PipelineLayoutError(
                f"{FQNS_KEY}: the {where} part names {', '.join(map(repr, wrong))}, not a"
                f" {where}-stage module of {type(model).__name__} ({', '.join(own)}) nor a block"
            )


class _Stage(PipelineStage):
    """A PipelineStage whose deferred gradient reduction (FSDP's post-backward, run by the
    schedule after the last microbatch, outside autograd) is attributed to backward, and
    whose shape-inference passes (forward and backward) run in eval mode."""

    backward_phase = staticmethod(contextlib.nullcontext)

    def perform_reduce_grad(self, grad_scale_factor: int):
        with self.backward_phase():
            super().perform_reduce_grad(grad_scale_factor)

    def _forward_metadata_inference(self, *args, **kwargs):
        # The first step runs the stage once on placeholder inputs to learn shapes (torch
        # 2.13). That pass is not training: in eval mode a MoE layer does not count its
        # tokens, which would otherwise move the balancing biases differently from 1 rank.
        return self._in_eval(super()._forward_metadata_inference, *args, **kwargs)

    def _backward_metadata_inference(self, *args, **kwargs):
        # ... and a real backward through that forward's graph to learn the gradients'
        # shapes: in eval mode too, so that activation checkpointing recomputes the forward
        # as it ran (a recompute in train mode runs other ops, which op SAC refuses).
        return self._in_eval(super()._backward_metadata_inference, *args, **kwargs)

    def _in_eval(self, fn, *args, **kwargs):
        was_training = self.submod.training
        self.submod.eval()
        try:
            return fn(*args, **kwargs)
        finally:
            self.submod.train(was_training)


def build_pipeline(
    parts: list[tuple[int, nn.Module]],
    layout: PipelineLayout,
    device: torch.device,
    pp_group: ProcessGroup,
    n_microbatches: int,
    *,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    backward_phase: Callable[[], AbstractContextManager] | None = None,
) -> _PipelineSchedule:
    """PipelineStage per part and the configured schedule over them. Gradients are not
    rescaled by the schedule: loss_fn already divides by the number of microbatches.
    backward_phase: a context manager factory marking work as backward (comm stats)."""
    stages = [
        _Stage(module, stage_id, layout.num_stages, device, group=pp_group)
        for stage_id, module in parts
    ]
    if backward_phase is not None:
        for stage in stages:
            stage.backward_phase = backward_phase
    if layout.csv:
        # torch's runtime: reads the per-rank actions, adds the sends, receives and FSDP's
        # unshard / reshard / gradient reduction (checked beforehand: check_schedule_csv)
        schedule = _PipelineScheduleRuntime(
            stages, n_microbatches=n_microbatches, loss_fn=loss_fn, scale_grads=False
        )
        schedule._load_csv(layout.csv)
        return schedule
    schedule_cls = get_schedule_class(layout.schedule)
    if issubclass(schedule_cls, PipelineScheduleSingle):
        return schedule_cls(
            stages[0], n_microbatches=n_microbatches, loss_fn=loss_fn, scale_grads=False
        )
    return schedule_cls(stages, n_microbatches=n_microbatches, loss_fn=loss_fn, scale_grads=False)


def run_schedule(
    schedule: _PipelineSchedule,
    layout: PipelineLayout,
    stage_ids: list[int],
    inputs: torch.Tensor,
    labels: torch.Tensor,
    *,
    train: bool = True,
    kwargs: dict | None = None,
) -> list[torch.Tensor]:
    """One pass of the schedule over a local batch (forward only unless `train`); the last
    stage's per-microbatch losses, [] on other ranks. `kwargs` (tensors of the batch, e.g.
    document ids) are split by microbatch and given to every stage's forward."""
    kwargs = kwargs or {}
    if not train and (layout.schedule in V_SCHEDULES or layout.csv):
        # torch 2.13's V schedules cannot run forward only (eval() asks a stage without
        # backward for its input gradients), nor a CSV schedule (its actions include the
        # backward): run the full step; the caller drops the gradients.
        with torch.enable_grad():
            return run_schedule(
                schedule, layout, stage_ids, inputs, labels, train=True, kwargs=kwargs
            )
    run = schedule.step if train else schedule.eval
    args = (inputs,) if 0 in stage_ids else ()
    losses: list[torch.Tensor] = []
    if layout.num_stages - 1 in stage_ids:
        run(*args, target=labels, losses=losses, **kwargs)
    else:
        run(*args, **kwargs)
    return losses
