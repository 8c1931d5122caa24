"""Pipeline parallel: cut a model (on meta) into stage modules and build the schedule.

A stage is a deep copy of the whole model with the blocks of other stages deleted from its
`layers` ModuleDict, and with the first-stage modules (embeddings) or last-stage modules
(norm, output) set to None elsewhere. Kept blocks keep their names (layers.5 stays layers.5),
so weight init, checkpoints and plans name parameters identically in every layout.
"""

import contextlib
import copy

import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class

from torchtitan.distributed.pipeline_layout import PipelineLayout


def split_model(
    model: nn.Module, layout: PipelineLayout, pp_rank: int, first_modules: tuple[str, ...], last_modules: tuple[str, ...]
) -> list[tuple[int, nn.Module]]:
    """(stage id, stage module) for each stage this pipeline rank holds."""
    parts = []
    for stage_id in layout.stage_ids(pp_rank):
        part = copy.deepcopy(model)
        keep = {str(i) for i in layout.stages[stage_id]}
        for name in list(part.layers.keys()):
            if name not in keep:
                del part.layers[name]
        if stage_id != 0:
            for name in first_modules:
                setattr(part, name, None)
        if stage_id != layout.num_stages - 1:
            for name in last_modules:
                setattr(part, name, None)
        parts.append((stage_id, part))
    return parts


class _Stage(PipelineStage):
    """A PipelineStage whose deferred gradient reduction (FSDP's post-backward, run by the
    schedule after the last microbatch, outside autograd) is attributed to backward, and
    whose shape-inference pass runs in eval mode."""

    backward_phase = staticmethod(contextlib.nullcontext)

    def perform_reduce_grad(self, grad_scale_factor: int):
        with self.backward_phase():
            super().perform_reduce_grad(grad_scale_factor)

    def _forward_metadata_inference(self, *args, **kwargs):
        # The first step runs the stage once on placeholder inputs to learn shapes (torch
        # 2.13). That pass is not training: in eval mode a MoE layer does not count its
        # tokens, which would otherwise move the balancing biases differently from 1 rank.
        was_training = self.submod.training
        self.submod.eval()
        try:
            return super()._forward_metadata_inference(*args, **kwargs)
        finally:
            self.submod.train(was_training)


def build_pipeline(
    parts: list[tuple[int, nn.Module]], layout: PipelineLayout, device: torch.device, pp_group,
    n_microbatches: int, loss_fn, backward_phase=None,
):
    """PipelineStage per part and the configured schedule over them. Gradients are not
    rescaled by the schedule: loss_fn already divides by the number of microbatches.
    backward_phase: a context manager factory marking work as backward (comm stats)."""
    stages = [_Stage(module, stage_id, layout.num_stages, device, group=pp_group) for stage_id, module in parts]
    if backward_phase is not None:
        for stage in stages:
            stage.backward_phase = backward_phase
    schedule_cls = get_schedule_class(layout.schedule)
    if issubclass(schedule_cls, PipelineScheduleSingle):
        return schedule_cls(stages[0], n_microbatches=n_microbatches, loss_fn=loss_fn, scale_grads=False)
    return schedule_cls(stages, n_microbatches=n_microbatches, loss_fn=loss_fn, scale_grads=False)
