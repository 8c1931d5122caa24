"""What one optimizer step does once its gradients are complete, shared by the trainer and
the memory simulation (which runs it on fake tensors), so that the simulated step cannot
drift from the run: a tied weight's copies get their summed gradient, under fault tolerance
the gradients are averaged over the replica groups (and the step given up when a group was
lost during it: not committed), the gradients are clipped by their global norm, a non-finite loss or norm is noted, the optimizers step (or,
stepped in backward already, only their schedules), the float8 all-gather's weight scales
are computed for the next step (when on), and the MoE layers' expert bias follows the
step's load.

Nothing here reads a tensor's value on the host (on a GPU the host queues the step and goes
on; on fake tensors there is no value): the non-finite note and the expert load stay on the
device (nonfinite.py, expert_balance.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch.distributed as dist
from torch import nn

from torchtitan.distributed.grad_norm import clip_grad_norm_
from torchtitan.distributed.parallel_dims import ParallelDims
from torchtitan.distributed.tied_copies import TiedCopies
from torchtitan.models.common.float8 import precompute_scales
from torchtitan.training.expert_balance import ExpertBalancer
from torchtitan.training.nonfinite import NonFiniteWatch
from torchtitan.training.optimizer import PartOptimizers
from torchtitan.training.phases import StepPhase
from torchtitan.training.step import StepResult, StepSums


def tied_copies(model_parts: list[nn.Module], dims: ParallelDims) -> TiedCopies | None:
    """A tied weight's copies on the first and last pipeline stage (distributed/tied_copies.py);
    None without a pipeline (one module holds the one parameter) or without tied weights."""
    if dims.pp > 1 and getattr(model_parts[0], "tied_weights", None):
        return TiedCopies(model_parts, dims.pp_ends_group())
    return None


def step_tail(
    sums: StepSums,
    step: int,
    model_parts: list[nn.Module],
    optimizers: PartOptimizers,
    max_norm: float,
    *,
    pp_group: dist.ProcessGroup | None,
    nonfinite: NonFiniteWatch,
    tied: TiedCopies | None = None,
    balancer: ExpertBalancer | None = None,
    float8_scales: bool = False,
    replicas=None,
    on_phase: Callable[[StepPhase], None] | None = None,
) -> StepResult:
    """The rest of step `step` after forward/backward left `sums` and the gradients: the
    phases of `phases.TAIL` in order (those without their part skipped), each announced to
    `on_phase` first. `pp_group`: the pipeline's (the norm spans every stage), None without.
    `float8_scales`: precompute the float8 all-gather's weight scales after the update
    (models/common/float8.precompute_scales_on). `replicas`: fault tolerance's replica groups
    (training/fault_tolerance.ReplicaGroups), None without."""

    def mark(phase: StepPhase) -> None:
        if on_phase is not None:
            on_phase(phase)

    params = [p for m in model_parts for p in m.parameters()]
    copies = []
    if tied is not None:  # one tied weight, two copies: summed gradients, counted once
        mark(StepPhase.TIED_COPIES)
        tied.sum_gradients()
        ids = tied.copies()
        copies = [p for p in params if id(p) in ids]
        params = [p for p in params if id(p) not in ids]
    committed = True
    if replicas is not None:
        mark(StepPhase.REPLICA_GROUPS)
        replicas.average(params + copies, sums)
        committed = replicas.commit()
    mark(StepPhase.CLIP)
    if optimizers.in_backward:  # stepped in backward: the norm its hooks measured (no clip)
        grad_norm = optimizers.grad_norm(sums.main.device)
    else:
        grad_norm = clip_grad_norm_(params, max_norm, pp_group, also_clip=copies)
    mark(StepPhase.NONFINITE)
    nonfinite.record(step, sums.main, grad_norm)
    if not committed:  # a group was lost during the step: no group takes it
        return StepResult(sums, grad_norm, None, committed=False)
    mark(StepPhase.OPTIMIZER)
    with replicas.stepping() if replicas is not None else contextlib.nullcontext():
        optimizers.step()  # semi-synchronous replica groups sync inside it (its hooks)
    if float8_scales:
        mark(StepPhase.FLOAT8_SCALES)
        precompute_scales(model_parts)
    load = None
    if balancer is not None:
        mark(StepPhase.EXPERT_BALANCE)
        load = balancer.step()
    return StepResult(sums, grad_norm, load)
