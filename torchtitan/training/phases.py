"""The phases of one training step, named once.

The step runner (step.py) and the step tail (step_tail.py) announce them; the memory
simulation's tracker records the one running (planning/simulate/), whose label of the peak
is plan.json's `peak_at`; the step-time model times the trace by them (planning/step_time/).
The values are what those files have always said: `StrEnum`, so a phase is its string in
f-strings, JSON and comparisons.

A pipeline action's label adds its microbatch and stage to the phase
(`label(StepPhase.FORWARD, 1, 0)` = "forward microbatch 1, stage 0"); `phase_of` reads the
phase back. (Comm stats keep their own coarser keys, forward / backward / other: the
observe layer sits below this one; observe/comm_stats.py.)
"""

from __future__ import annotations

import functools
from enum import StrEnum


class StepPhase(StrEnum):
    SETUP = "setup"  # before the step (the simulation's census, a pipeline's shape inference)
    FORWARD = "forward"
    LOSS = "loss"
    BACKWARD = "backward"
    BACKWARD_WEIGHTS = "backward (weights)"  # zero-bubble schedules: the weight gradients apart
    GRADIENT_REDUCTION = "backward (gradient reduction)"  # a pipeline's deferred reduction
    PIPELINE = "pipeline"  # the schedule's own work between actions (P2P buffers)
    # the step tail (step_tail.py), in this order
    TIED_COPIES = "tied copies"
    REPLICA_GROUPS = "replica groups"  # fault tolerance: averaged over the replica groups
    CLIP = "clip"
    NONFINITE = "non-finite record"
    OPTIMIZER = "optimizer"
    FLOAT8_SCALES = "float8 scales"  # the float8-gathered weights' scales, after the update
    EXPERT_BALANCE = "expert balance"


# after the gradients are complete: every rank runs them once per step, after backward
TAIL = (
    StepPhase.TIED_COPIES,
    StepPhase.REPLICA_GROUPS,
    StepPhase.CLIP,
    StepPhase.NONFINITE,
    StepPhase.OPTIMIZER,
    StepPhase.FLOAT8_SCALES,
    StepPhase.EXPERT_BALANCE,
)
BACKWARD = frozenset({StepPhase.BACKWARD, StepPhase.BACKWARD_WEIGHTS, StepPhase.GRADIENT_REDUCTION})


def label(phase: StepPhase, microbatch: int | None = None, stage: int | None = None) -> str:
    """A pipeline action's label: the phase, then its microbatch and stage where known."""
    chunk = f" microbatch {microbatch}" if microbatch is not None else ""
    where = f", stage {stage}" if stage is not None else ""
    return f"{phase}{chunk}{where}"


# longest first: "backward (weights) ..." is a weight-gradient label, not a plain backward one
_BY_LENGTH = sorted(StepPhase, key=lambda p: -len(p.value))


@functools.lru_cache(maxsize=4096)
def phase_of(text: str) -> StepPhase:
    """The phase of a label (`label`'s output or a bare phase); ValueError for any other text."""
    for phase in _BY_LENGTH:
        if text.startswith(phase.value) and text[len(phase.value) :][:1] in ("", " ", ","):
            return phase
    raise ValueError(f"not a step phase label: {text!r}")
