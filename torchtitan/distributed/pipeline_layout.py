"""Which blocks go to which pipeline stage, and which stages to which rank. Torch-free, so
the config check can reject an impossible split before any process starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from torchtitan.distributed.plan import BLOCKS

if TYPE_CHECKING:
    from torchtitan.config.job_config import Parallelism

SINGLE_STAGE = ("GPipe", "1F1B")
V_SCHEDULES = ("ZBVZeroBubble", "DualPipeV")
ZERO_BUBBLE = ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")


class PipelineLayoutError(ValueError):
    pass


@dataclass(frozen=True)
class PipelineLayout:
    stages: tuple[tuple[int, ...], ...]  # block indices of each stage, in model order
    pp: int
    schedule: str

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def stages_per_rank(self) -> int:
        return self.num_stages // self.pp

    def stage_ids(self, pp_rank: int) -> list[int]:
        """Stages held by pipeline rank `pp_rank`: loop order (r, r+pp, ...) or V order."""
        if self.schedule in V_SCHEDULES:
            return [pp_rank, self.num_stages - 1 - pp_rank]
        return list(range(pp_rank, self.num_stages, self.pp))


def pipeline_layout(p: Parallelism, n_layers: int, n_microbatches: int) -> PipelineLayout | None:
    """The [parallelism] split of `n_layers` blocks (None without pipeline parallel); raises
    PipelineLayoutError as plan_pipeline does. The checks, the build path and the model-states
    floor all call this."""
    if p.pipeline_parallel_degree == 1:
        return None
    return plan_pipeline(
        n_layers,
        p.pipeline_parallel_degree,
        p.pipeline_parallel_schedule,
        p.pipeline_parallel_layers_per_stage,
        p.pipeline_parallel_split_points,
        n_microbatches=n_microbatches,
    )


def plan_pipeline(
    n_layers: int,
    pp: int,
    schedule: str,
    layers_per_stage: int | str,
    split_points: list[str],
    *,
    n_microbatches: int,
) -> PipelineLayout:
    """Raise PipelineLayoutError (one line, naming the key) when the split is impossible."""
    key = "--parallelism.pipeline_parallel"
    if split_points:
        try:
            bounds = [int(s.split(".")[-1]) for s in split_points]  # block names: f"{BLOCKS}.<i>"
        except ValueError:
            raise PipelineLayoutError(
                f"{key}_split_points={','.join(split_points)}: use block names like {BLOCKS}.2,{BLOCKS}.4"
            ) from None
        if bounds != sorted(set(bounds)) or bounds[0] <= 0 or bounds[-1] >= n_layers:
            raise PipelineLayoutError(
                f"{key}_split_points={','.join(split_points)}: boundaries must increase strictly"
                f" within {BLOCKS}.1 .. {BLOCKS}.{n_layers - 1}"
            )
        edges = [0, *bounds, n_layers]
    else:
        if layers_per_stage == "auto":
            # Stages per rank: 1 (GPipe, 1F1B), 2 (V schedules), else the fewest >= 2 that
            # split the blocks evenly (6 blocks on 2 ranks -> 3 stages per rank).
            if schedule in SINGLE_STAGE:
                options = [1]
            elif schedule in V_SCHEDULES:
                options = [2]
            else:
                options = [k for k in range(2, n_layers // pp + 1) if n_layers % (pp * k) == 0] or [
                    2
                ]
            num_stages = pp * options[0]
            if n_layers % num_stages:
                raise PipelineLayoutError(
                    f"{n_layers} layers do not split evenly into {num_stages} stages"
                    f" ({pp} ranks x {num_stages // pp} per rank for {schedule}); change"
                    f" {key}_degree, set {key}_layers_per_stage or {key}_split_points"
                )
            layers_per_stage = n_layers // num_stages
        elif layers_per_stage < 1 or n_layers % layers_per_stage:
            raise PipelineLayoutError(
                f"{key}_layers_per_stage={layers_per_stage} does not divide the {n_layers} layers"
            )
        edges = list(range(0, n_layers + 1, layers_per_stage))
    stages = tuple(tuple(range(a, b)) for a, b in zip(edges, edges[1:]))
    n = len(stages)

    if n % pp:
        raise PipelineLayoutError(
            f"{n} pipeline stages cannot be spread over {key}_degree={pp} ranks; make the number"
            f" of stages a multiple of {pp}"
        )
    per_rank = n // pp
    if schedule in SINGLE_STAGE and per_rank != 1:
        raise PipelineLayoutError(
            f"{key}_schedule={schedule} runs one stage per rank but the split gives {per_rank};"
            " use Interleaved1F1B or change the split"
        )
    if schedule in V_SCHEDULES and per_rank != 2:
        raise PipelineLayoutError(
            f"{key}_schedule={schedule} needs exactly two stages per rank but the split gives {per_rank}"
        )
    if schedule in ("1F1B", "DualPipeV") and n_microbatches < n:
        raise PipelineLayoutError(
            f"{key}_schedule={schedule} needs at least {n} microbatches (one per stage) but gets"
            f" {n_microbatches}; raise local_batch_size or lower {key}_microbatch_size"
        )
    if schedule in ("Interleaved1F1B", "InterleavedZeroBubble"):
        rounds = max(1, n_microbatches // pp)
        if n_microbatches % rounds:
            raise PipelineLayoutError(
                f"{key}_schedule={schedule} needs the {n_microbatches} microbatches to be a multiple"
                f" of {rounds} rounds; use a multiple of {key}_degree={pp} microbatches"
            )
    return PipelineLayout(stages=stages, pp=pp, schedule=schedule)
