"""What a prediction simulates, and what it derives from simulations (and why that is exact).

Simulated (simulate.py): every role of a job of at most EXACT_LIMIT block-microbatches per
pipeline rank, step by step on fake tensors. Two shortcuts keep large jobs fast, checked
against full simulation in tests/integration/test_memory_fake_world.py:

1. Blocks per stage (`variants`, `extrapolated`). Above EXACT_LIMIT the job is simulated
   with 1 and with 2 blocks per stage (same stages, schedule, batch, microbatches) and each
   role is extrapolated linearly to its real block count: everything a step holds per
   block (parameters, states, saved activations, gathered units, gradients) grows by the
   same bytes with each block of a stage. Byte-equal for ranks holding only blocks. Short
   on the first pipeline rank when its peak moves with more blocks from the start of its
   backward to the embeddings' backward (unsharded block gradients under PP pile up faster
   than one microbatch's activations): -1.1% at 3 blocks, -2.8% at 4 in the tiny test model,
   whose embeddings are large next to its blocks. Not used when a stage mixes block kinds
   (DeepSeek-V3's dense prefix must fill whole stages) or under a memory budget's freeing.
2. Middle pipeline ranks (`rank_plan`, `interpolated`). Under a single-stage schedule (1F1B,
   GPipe) on 5 or more pipeline ranks, the middle ranks up to pp-2 whose stages are alike
   (all of 1 .. pp-2, but for the first ones where the weighted split gave a block more) are
   interpolated between that run's end ranks; the others are simulated. A middle rank
   differs from its alike neighbours only in the microbatches in flight when it peaks
   (1F1B: min(microbatches, pp - rank) warm-up forwards; GPipe: all), each holding the same
   bytes, so it is interpolated in that count. When the run's ends peak at different points
   of their schedules (the count is not what decides their peak), every middle rank is
   simulated.
   Byte-equal (1F1B and GPipe, Llama3 and DeepSeek-V3 with EP).

Modelled by formula rather than run: nothing else here (simulation_patches.py lists the three paths
the simulation runs changed).
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass

from torchtitan.training.planned_job import PlannedJob

# Above this many block-microbatches per rank a step is simulated with 1 and 2 blocks per
# stage and extrapolated linearly to the real count; below it, exactly.
EXACT_LIMIT: int | None = (
    None  # None: TITAN_MEMORY_EXACT_LIMIT (checked by the config check), else 48
)
FROM_BLOCKS = (1, 2)  # the blocks per stage of the two simulated reductions


def blocks_per_stage(job: PlannedJob) -> list[list[int]]:
    """Per pipeline rank, the block counts of its stages."""
    layout = job.layout
    if layout is None:
        return [[job.args.n_layers]]
    return [[len(layout.stages[s]) for s in layout.stage_ids(r)] for r in range(job.dims.pp)]


def _reduced(job: PlannedJob, k: int):
    """(cfg, args) of the job with k blocks per stage, or None when a stage mixes block kinds."""
    cfg, args, layout = job.cfg, job.args, job.layout
    dense = args.n_dense_layers
    stages = layout.stages if layout is not None else (tuple(range(args.n_layers)),)
    kinds = [{i < dense for i in st} for st in stages]
    if any(len(kind) > 1 for kind in kinds):
        return None
    new_dense = k * sum(1 for kind in kinds if kind == {True})
    small = dataclasses.replace(
        args, n_layers=k * len(stages), **({"n_dense_layers": new_dense} if dense else {})
    )
    if layout is None:
        return cfg, small
    # the same stages with k blocks each, by explicit boundaries (layers_per_stage would weigh
    # the embedding and the output and give another stage count)
    bounds = [f"layers.{k * s}" for s in range(1, len(stages))]
    p = dataclasses.replace(
        cfg.parallelism,
        pipeline_parallel_split_points=bounds,
        module_fqns_per_model_part=[],
    )
    return dataclasses.replace(cfg, parallelism=p), small


def variants(job: PlannedJob, budget_freeing: bool) -> list[PlannedJob]:
    """The jobs to simulate: the job itself, or its 1- and 2-block-per-stage reductions
    (shortcut 1), each with its model on meta."""
    work = max(sum(c) for c in blocks_per_stage(job)) * (job.microbatches or 1)
    limit = (
        EXACT_LIMIT
        if EXACT_LIMIT is not None
        else int(os.environ.get("TITAN_MEMORY_EXACT_LIMIT") or 48)
    )
    if work <= limit or budget_freeing:
        return [job]
    small = [_reduced(job, k) for k in FROM_BLOCKS]
    if any(s is None for s in small):
        return [job]
    return [job.with_args(s_cfg, s_args) for s_cfg, s_args in small]


def extrapolated(r1, r2, blocks: list[int]):
    """A role from its 1- and 2-block-per-stage predictions, at its real blocks per stage."""
    lo, hi = FROM_BLOCKS
    x = (sum(blocks) / len(blocks) - lo) / (hi - lo)

    def line(a: int, b: int) -> int:
        return max(0, round(a + x * (b - a)))

    peak, at, breakdown = r2.predicted_peak_bytes, r2.peak_at, r2.breakdown
    peak = line(r1.predicted_peak_bytes, peak)
    breakdown = {k: line(r1.breakdown.get(k, 0), v) for k, v in breakdown.items()}
    if r1.points and r2.points:
        # the peak before the step tail and the one in it, each along its own line: the
        # larger at the real block count (Muon's exchange buffers grow per block faster than
        # a backward peak does, so the small variants may peak in the tail, the real job not)
        lines = {
            name: (
                line(r1.points[name][0], r2.points[name][0]),
                r2.points[name][2],
                {k: line(r1.points[name][1].get(k, 0), v) for k, v in r2.points[name][1].items()},
            )
            for name in r2.points
        }
        name = max(lines, key=lambda n: lines[n][0])
        peak, at, breakdown = lines[name]
        if name == max(r2.points, key=lambda n: r2.points[n][0]):
            at = r2.peak_at  # where r2 peaks too: its label (with what derived it)
    worst = line(r1.worst_case_peak_bytes, r2.worst_case_peak_bytes)
    return dataclasses.replace(
        r2,
        predicted_peak_bytes=peak,
        worst_case_peak_bytes=max(worst, peak),
        peak_at=(f"{at[:-1]}; " if at.endswith(")") else f"{at} (")
        + "extrapolated from 1 and 2 blocks per stage)",
        breakdown=breakdown,
    )


@dataclass
class RankPlan:
    simulated: list[int]  # pipeline ranks simulated up front
    derived: list[int]  # ranks interpolated from simulated ones (shortcut 2), if they allow it
    in_flight: dict[int, int]  # middle rank -> microbatches in flight at its peak


def _in_flight(job: PlannedJob) -> dict[int, int] | None:
    cfg, dims, layout = job.cfg, job.dims, job.layout
    if layout is None or dims.pp < 5 or layout.stages_per_rank != 1:
        return None
    n = cfg.training.local_batch_size // cfg.parallelism.pipeline_parallel_microbatch_size
    schedule = cfg.parallelism.pipeline_parallel_schedule
    if (
        schedule == "1F1B"
    ):  # torch's Schedule1F1B: min(microbatches, stages - stage) warm-up forwards
        return {r: min(n, dims.pp - r) for r in range(1, dims.pp - 1)}
    if schedule == "GPipe":
        return {r: n for r in range(1, dims.pp - 1)}
    return None


def rank_plan(job: PlannedJob, budget_freeing: bool) -> RankPlan:
    """Which pipeline ranks to simulate (shortcut 2 where it applies): the middle ranks up to
    pp-2 whose stages are alike (the weighted split gives the first stages a block more where
    the blocks do not divide: those are simulated), interpolated between the run's ends."""
    dims, layout = job.dims, job.layout
    in_flight = _in_flight(job)
    everyone = RankPlan(list(range(dims.pp)), [], {})
    if in_flight is None or budget_freeing:  # per-rank freeing: every rank its own
        return everyone
    dense = job.args.n_dense_layers
    kind = {r: tuple(i < dense for i in layout.stages[r]) for r in range(1, dims.pp - 1)}
    last = dims.pp - 2
    first = last
    while first > 1 and kind[first - 1] == kind[last]:
        first -= 1
    if last - first < 2:  # no rank between two alike ones
        return everyone
    derived = list(range(first + 1, last))
    return RankPlan(
        [r for r in range(dims.pp) if r not in derived],
        derived,
        {r: in_flight[r] for r in range(first, last + 1)},
    )


def _phase(role) -> str:
    return role.peak_at.split(", stage ")[0]


def _same_point(a, b, fa: int, fb: int) -> bool:
    """Ranks a and b (fa, fb microbatches in flight) peak at the same point of their
    schedules: the same phase of the same microbatch (e.g. 1F1B's second backward), or of
    the microbatch as far from their in-flight counts (e.g. the last warm-up forward)."""
    pa, pb = _phase(a), _phase(b)
    if pa == pb:
        return True
    ma, mb = re.fullmatch(r"(.*) microbatch (\d+)", pa), re.fullmatch(r"(.*) microbatch (\d+)", pb)
    return bool(ma and mb and ma[1] == mb[1] and int(ma[2]) - fa == int(mb[2]) - fb)


def interpolable(roles: dict, plan: RankPlan) -> bool:
    """The alike run's end ranks (1 and pp-2 when every middle stage is alike) peak at the
    same point of their schedules (and, holding as many microbatches, at the same bytes)."""
    a, b = roles[min(plan.in_flight)], roles[max(plan.in_flight)]
    fa, fb = plan.in_flight[a.pp_rank], plan.in_flight[b.pp_rank]
    return _same_point(a, b, fa, fb) and not (
        fa == fb and a.predicted_peak_bytes != b.predicted_peak_bytes
    )


def _shifted(phase: str, by: int) -> str:
    m = re.fullmatch(r"(.*) microbatch (\d+)", phase)
    return phase if m is None else f"{m[1]} microbatch {int(m[2]) + by}"


def interpolated(roles: dict, plan: RankPlan, pp_rank: int, ranks: list[int]):
    """Middle rank `pp_rank`, linear in its microbatches in flight between the alike run's
    end ranks."""
    a, b = roles[min(plan.in_flight)], roles[max(plan.in_flight)]
    fa, fb, f = plan.in_flight[a.pp_rank], plan.in_flight[b.pp_rank], plan.in_flight[pp_rank]
    t = 0.0 if fa == fb else (f - fa) / (fb - fa)

    def line(x: int, y: int) -> int:
        return max(0, round(x + t * (y - x)))

    return dataclasses.replace(
        a,
        role=f"pp{pp_rank}",
        ranks=ranks,
        pp_rank=pp_rank,
        stage_ids=[pp_rank],
        predicted_peak_bytes=line(a.predicted_peak_bytes, b.predicted_peak_bytes),
        worst_case_peak_bytes=line(a.worst_case_peak_bytes, b.worst_case_peak_bytes),
        peak_at=f"{_phase(a) if _phase(a) == _phase(b) else _shifted(_phase(a), f - fa)}, stage {pp_rank}"
        f" (interpolated: {f} microbatches in flight)",
        breakdown={k: line(a.breakdown.get(k, 0), b.breakdown.get(k, 0)) for k in a.breakdown},
        points=None
        if not (a.points and b.points)
        else {
            name: (
                line(a.points[name][0], b.points[name][0]),
                {k: line(v, b.points[name][1].get(k, 0)) for k, v in a.points[name][1].items()},
                f"{a.points[name][2].split(', stage ')[0]}, stage {pp_rank}"
                f" (interpolated: {f} microbatches in flight)",
            )
            for name in a.points
        },
    )
