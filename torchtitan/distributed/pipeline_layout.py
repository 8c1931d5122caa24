"""Which blocks go to which pipeline stage, and which stages to which rank. Torch-free, so
the config check can reject an impossible split before any process starts.

The split, as upstream torchtitan makes it: the embedding counts as
`first_stage_less_layers` blocks and the output as `last_stage_less_layers` (1 each by
default), and those L + first + last "layers" are dealt out as evenly as possible, the
first stages taking one more where they do not divide. So 6 blocks on 2 stages give 3 + 3,
on 4 stages 1 + 2 + 2 + 1, on 8 stages 0 + 1 + 1 + 1 + 1 + 1 + 1 + 0 (the first stage runs
only the embedding, the last only the norm and output). The number of stages is one per
rank (GPipe, 1F1B) or two (the other schedules), or ceil((L + first + last) /
layers_per_stage); split points or module_fqns_per_model_part give the split outright.
"""

from __future__ import annotations

import csv
import math
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torchtitan.distributed.plan import BLOCKS

if TYPE_CHECKING:
    from torchtitan.config.job_config import Parallelism

SINGLE_STAGE = ("GPipe", "1F1B")
V_SCHEDULES = ("ZBVZeroBubble", "DualPipeV")
# Schedules that split a backward into input and weight passes (a CSV schedule may: I, W).
ZERO_BUBBLE = ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV", "PipelineScheduleMulti")
CSV_SCHEDULE = "PipelineScheduleMulti"
KEY = "--parallelism.pipeline_parallel"
FQNS_KEY = "--parallelism.module_fqns_per_model_part"

_ACTION = re.compile(r"(\d+)([FIWB])(\d+)")  # torch's compute actions: <stage><kind><microbatch>


class PipelineLayoutError(ValueError):
    pass


@dataclass(frozen=True)
class PipelineLayout:
    stages: tuple[
        tuple[int, ...], ...
    ]  # block indices of each stage, in model order (may be empty)
    pp: int
    schedule: str
    csv: str = ""  # a CSV schedule run by torch's schedule runtime ("" = the named schedule)
    # The other modules module_fqns_per_model_part names on the first / last stage (checked
    # against the model's first_stage_modules / last_stage_modules when it is split).
    first_modules: tuple[str, ...] = ()
    last_modules: tuple[str, ...] = ()

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def stages_per_rank(self) -> int:
        return self.num_stages // self.pp

    def blocks_note(self, stage_id: int) -> str:
        """The blocks of a stage for a log line: "layers 3-5", "layers 4", "no blocks"."""
        held = self.stages[stage_id]
        if not held:
            return "no blocks"
        return f"{BLOCKS} {held[0]}" + (f"-{held[-1]}" if len(held) > 1 else "")

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
        first_less=p.pipeline_parallel_first_stage_less_layers,
        last_less=p.pipeline_parallel_last_stage_less_layers,
        fqns=p.module_fqns_per_model_part,
        csv_path=p.pipeline_parallel_schedule_csv,
    )


def weighted_split(
    n_layers: int, n_stages: int, first_less: int = 1, last_less: int = 1
) -> tuple[tuple[int, ...], ...]:
    """Upstream's split of `n_layers` blocks into `n_stages` stages, the first stage
    `first_less` and the last `last_less` blocks short of an even share (module docstring)."""
    for name, value in (("first", first_less), ("last", last_less)):
        if value < 0:
            raise PipelineLayoutError(f"{KEY}_{name}_stage_less_layers={value}: must be >= 0")
    total = n_layers + first_less + last_less
    if n_stages > total:
        raise PipelineLayoutError(
            f"{n_stages} pipeline stages for {n_layers} layers + {first_less} ({KEY}_first_stage_less_layers)"
            f" + {last_less} ({KEY}_last_stage_less_layers): more stages than that; use fewer stages"
            f" ({KEY}_degree, {KEY}_layers_per_stage)"
        )
    share, extra = divmod(total, n_stages)
    for name, value in (("first", first_less), ("last", last_less)):
        if value > share:
            raise PipelineLayoutError(
                f"{KEY}_{name}_stage_less_layers={value} exceeds the {share} layers per stage of"
                f" {n_stages} stages over {n_layers} layers (+{first_less}+{last_less}); lower it or use"
                " fewer stages"
            )
    sizes = [share + (s < extra) for s in range(n_stages)]
    sizes[0] -= first_less
    sizes[-1] -= last_less
    edges = [0]
    for size in sizes:
        edges.append(edges[-1] + size)
    return tuple(tuple(range(a, b)) for a, b in zip(edges, edges[1:]))


def _stage_count(n_layers: int, pp: int, schedule: str, per_stage, weights: tuple[int, int]) -> int:
    """Stages of the weighted split: 1 or 2 per rank (auto), or ceil(weighted layers /
    layers_per_stage), checked against the schedule as upstream does."""
    if per_stage == "auto":
        return pp * (1 if schedule in SINGLE_STAGE else 2)
    if per_stage < 1:
        raise PipelineLayoutError(f"{KEY}_layers_per_stage={per_stage}: must be >= 1 (or auto)")
    total = n_layers + sum(weights)
    n = math.ceil(total / per_stage)
    what = (
        f"{KEY}_layers_per_stage={per_stage} gives ceil(({n_layers} layers + {weights[0]} + {weights[1]})"
        f" / {per_stage}) = {n} stages"
    )
    if n % pp:
        raise PipelineLayoutError(
            f"{what}, not a multiple of {KEY}_degree={pp}; pick layers_per_stage for a multiple"
        )
    if schedule not in SINGLE_STAGE and n // pp < 2:
        raise PipelineLayoutError(
            f"{what}, {n // pp} per rank, but {KEY}_schedule={schedule} runs at least 2 per rank;"
            " lower layers_per_stage or use 1F1B or GPipe"
        )
    return n


def _from_split_points(split_points: list[str], n_layers: int) -> tuple[tuple[int, ...], ...]:
    try:
        bounds = [int(s.split(".")[-1]) for s in split_points]  # block names: f"{BLOCKS}.<i>"
    except ValueError:
        raise PipelineLayoutError(
            f"{KEY}_split_points={','.join(split_points)}: use block names like {BLOCKS}.2,{BLOCKS}.4"
        ) from None
    if bounds != sorted(set(bounds)) or bounds[0] <= 0 or bounds[-1] >= n_layers:
        raise PipelineLayoutError(
            f"{KEY}_split_points={','.join(split_points)}: boundaries must increase strictly"
            f" within {BLOCKS}.1 .. {BLOCKS}.{n_layers - 1}"
        )
    edges = [0, *bounds, n_layers]
    return tuple(tuple(range(a, b)) for a, b in zip(edges, edges[1:]))


def _from_fqns(parts: list[list[str]], n_layers: int):
    """(stages, first stage's other modules, last stage's) of module_fqns_per_model_part."""
    stages, others = [], []
    for i, names in enumerate(parts):
        blocks, rest = [], []
        for name in names:
            head, _, index = name.partition(".")
            if head == BLOCKS and not index.isdigit():
                raise PipelineLayoutError(
                    f"{FQNS_KEY}: {name!r} is not a block; blocks are {BLOCKS}.0 .. {BLOCKS}.{n_layers - 1}"
                )
            if head == BLOCKS:
                blocks.append(int(index))
            elif 0 < i < len(parts) - 1:
                raise PipelineLayoutError(
                    f"{FQNS_KEY}: part {i} names {name!r}; only blocks go to the middle stages (the"
                    " embedding goes to the first part, the norm and output to the last)"
                )
            else:
                rest.append(name)
        stages.append(tuple(blocks))
        others.append(tuple(rest))
    held = [b for stage in stages for b in stage]
    if held != list(range(n_layers)):
        raise PipelineLayoutError(
            f"{FQNS_KEY}: the parts must name {BLOCKS}.0 .. {BLOCKS}.{n_layers - 1} once each, in"
            f" order; they name {', '.join(f'{BLOCKS}.{b}' for b in held) or 'none'}"
        )
    return tuple(stages), others[0], others[-1] if len(parts) > 1 else ()


def plan_pipeline(
    n_layers: int,
    pp: int,
    schedule: str,
    layers_per_stage: int | str,
    split_points: list[str],
    *,
    n_microbatches: int,
    first_less: int = 1,
    last_less: int = 1,
    fqns: list[list[str]] | None = None,
    csv_path: str = "",
) -> PipelineLayout:
    """The split (module_fqns_per_model_part, else split points, else the weighted split) and
    its placement; raise PipelineLayoutError (one line, naming the key) when impossible."""
    first_modules: tuple[str, ...] = ()
    last_modules: tuple[str, ...] = ()
    if fqns:
        stages, first_modules, last_modules = _from_fqns(fqns, n_layers)
    elif split_points:
        stages = _from_split_points(split_points, n_layers)
    else:
        n = _stage_count(n_layers, pp, schedule, layers_per_stage, (first_less, last_less))
        stages = weighted_split(n_layers, n, first_less, last_less)
    n = len(stages)

    if n % pp:
        raise PipelineLayoutError(
            f"{n} pipeline stages cannot be spread over {KEY}_degree={pp} ranks; make the number"
            f" of stages a multiple of {pp}"
        )
    per_rank = n // pp
    if schedule in SINGLE_STAGE and per_rank != 1:
        raise PipelineLayoutError(
            f"{KEY}_schedule={schedule} runs one stage per rank but the split gives {per_rank};"
            " use Interleaved1F1B or change the split"
        )
    if schedule in V_SCHEDULES and per_rank != 2:
        raise PipelineLayoutError(
            f"{KEY}_schedule={schedule} needs exactly two stages per rank but the split gives {per_rank}"
        )
    if schedule in ("1F1B", "DualPipeV") and n_microbatches < n and not csv_path:
        raise PipelineLayoutError(
            f"{KEY}_schedule={schedule} needs at least {n} microbatches (one per stage) but gets"
            f" {n_microbatches}; raise local_batch_size or lower {KEY}_microbatch_size"
        )
    if schedule in ("Interleaved1F1B", "InterleavedZeroBubble") and not csv_path:
        rounds = max(1, n_microbatches // pp)
        if n_microbatches % rounds:
            raise PipelineLayoutError(
                f"{KEY}_schedule={schedule} needs the {n_microbatches} microbatches to be a multiple"
                f" of {rounds} rounds; use a multiple of {KEY}_degree={pp} microbatches"
            )
    if schedule == CSV_SCHEDULE and not csv_path:
        raise PipelineLayoutError(
            f"{KEY}_schedule={CSV_SCHEDULE} runs a schedule from a file: set {KEY}_schedule_csv"
            " (one row of actions per pipeline rank, e.g. tests/assets/custom_schedule.csv)"
        )
    layout = PipelineLayout(stages, pp, schedule, csv_path, first_modules, last_modules)
    if csv_path:
        check_schedule_csv(layout, n_microbatches)
    return layout


def check_schedule_csv(layout: PipelineLayout, n_microbatches: int) -> None:
    """The CSV schedule against the layout, as torch's runtime will read it: one row per
    pipeline rank of compute actions (F forward, B full backward, I/W its input and weight
    halves, e.g. 2F0 = stage 2, microbatch 0; empty cells idle), each rank running only its
    own stages, every stage one F and one B (or one I, then one W) per microbatch, in order."""
    path = layout.csv
    key = f"{KEY}_schedule_csv={path}"
    if not os.path.isfile(path):
        raise PipelineLayoutError(
            f"{key}: no such file; give a CSV of pipeline actions, one row per pipeline rank"
        )
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if len(rows) != layout.pp:
        raise PipelineLayoutError(
            f"{key}: {len(rows)} rows for {KEY}_degree={layout.pp}; write one row per pipeline rank"
        )
    seen: dict[tuple[int, int], str] = {}  # (stage, microbatch) -> its actions so far
    for rank, row in enumerate(rows):
        held = layout.stage_ids(rank)
        for cell in (c.strip() for c in row):
            if not cell:
                continue
            m = _ACTION.fullmatch(cell)
            if m is None:
                raise PipelineLayoutError(
                    f"{key}: rank {rank}'s action {cell!r} is not <stage><F|B|I|W><microbatch>"
                    " (compute actions only; torch adds the sends and receives)"
                )
            stage, kind, mb = int(m[1]), m[2], int(m[3])
            if stage not in held:
                raise PipelineLayoutError(
                    f"{key}: rank {rank} runs {cell} but holds stages {held} of {layout.num_stages}"
                    f" (the {'V' if layout.schedule in V_SCHEDULES else 'loop'} placement of"
                    f" {KEY}_schedule={layout.schedule})"
                )
            if mb >= n_microbatches:
                raise PipelineLayoutError(
                    f"{key}: {cell} names microbatch {mb} but a step has {n_microbatches}"
                    f" (training.local_batch_size / {KEY}_microbatch_size)"
                )
            done = seen.get((stage, mb), "")
            if (
                kind in done
                or (kind != "F" and "F" not in done)
                or (kind == "W" and "I" not in done)
            ):
                raise PipelineLayoutError(
                    f"{key}: rank {rank}'s {cell} after {done or 'nothing'} of stage {stage}"
                    f" microbatch {mb}; each needs F, then B (or I, then W), once each"
                )
            seen[(stage, mb)] = done + kind
    for stage in range(layout.num_stages):
        for mb in range(n_microbatches):
            if seen.get((stage, mb)) not in ("FB", "FIW"):
                raise PipelineLayoutError(
                    f"{key}: stage {stage} microbatch {mb} runs {seen.get((stage, mb)) or 'nothing'};"
                    " every stage needs F and B (or F, I and W) for every microbatch"
                )
