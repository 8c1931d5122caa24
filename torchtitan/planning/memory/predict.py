"""The per-rank-role peak memory of a training step, predicted before launch.

A role is a pipeline rank: ranks of one pipeline rank hold the same shapes at every
data / tensor / expert-parallel coordinate (FSDP2 and SimpleFSDP pad uneven shards to equal
size; TP and EP degrees must divide what they split, which the config check enforces), so
the role's prediction is that of its first coordinate, and `ranks` lists them all.

Each role's step is simulated on fake tensors (simulate.py) in this process, which must
have joined a process group of the job's world size (the dry run's fake one). For a MoE
job with expert parallelism the planned figure assumes the routing skew of
`planning.memory_skew` (1 = balanced) and the worst case (every token copy of the EP group
routed to one rank's experts) is simulated beside it.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

import torch

from torchtitan.distributed.parallel_dims import MeshDim, ParallelDims
from torchtitan.planning.simulate import pool as simulation_pool
from torchtitan.planning.simulate import roles as derived_roles
from torchtitan.planning.simulate.step import CATEGORIES
from torchtitan.planning.step_time import model as step_time
from torchtitan.planning.step_time import roles as role_times
from torchtitan.planning.step_time.rank import RankTimer
from torchtitan.training.build import resolve_parts
from torchtitan.training.planned_job import PlannedJob
from torchtitan.units import GIB


@dataclass
class RolePrediction:
    role: str
    ranks: list[int]
    pp_rank: int
    stage_ids: list[int]
    predicted_peak_bytes: int
    worst_case_peak_bytes: int
    peak_at: str
    breakdown: dict[str, int]
    time: step_time.RoleTime | None = None  # the step-time prediction (with a hardware profile)
    # the simulated peaks before the step tail and in it: (bytes, breakdown, phase) (not in
    # plan.json: the block extrapolation follows each)
    points: dict | None = None

    def record(self) -> dict:
        """The plan.json `memory_per_rank_role` entry (a stable format: tools read it)."""
        return {
            "role": self.role,
            "ranks": self.ranks,
            "stages": self.stage_ids,
            "predicted_peak_bytes": self.predicted_peak_bytes,
            "worst_case_peak_bytes": self.worst_case_peak_bytes,
            "peak_at": self.peak_at,
            "breakdown": self.breakdown,
        }


def ranks_of_pp_rank(dims: ParallelDims, pp_rank: int) -> list[int]:
    """Global ranks whose pipeline coordinate is `pp_rank` (every rank when no PP)."""
    if dims.pp == 1:
        return list(range(dims.world_size))
    names = list(dims.mesh_shape)
    shape = [dims.mesh_shape[n] for n in names]
    pp_axis = names.index(MeshDim.PP.value)
    ranks = torch.arange(dims.world_size).view(*shape)
    return sorted(ranks.select(pp_axis, pp_rank).flatten().tolist())


@dataclass
class Prediction:
    roles: list[RolePrediction]
    plan_records: list[dict]  # plan.json `model_parts` entries of every stage
    free_bytes: dict[int, int]  # per pipeline rank: kept bytes auto frees for the budget
    budget_note: str = ""


def predict(job: PlannedJob, budget: int | None = None, hardware=None) -> Prediction:
    """Every role's peak. With reshard_after_forward=auto and a budget some role exceeds,
    the plan frees kept units (reshard_policy) by what the prediction says is over, and
    predicts again, until every role fits or nothing kept is left to free."""
    free: dict[int, int] = {}
    note = ""
    roles, records = predict_roles(job, hardware=hardware)
    if budget is None or job.cfg.parallelism.reshard_after_forward != "auto":
        return Prediction(roles, records, free)
    for _ in range(4):
        over = {
            r.pp_rank: r.predicted_peak_bytes - budget
            for r in roles
            if r.predicted_peak_bytes > budget
        }
        kept = {
            pp: sum(
                u["param_bytes"]
                for rec in records
                if rec["stage"] in _stages(roles, pp)
                for u in rec["fsdp_units"]
                if not u["reshard_after_forward"] and u["name"] != "<root>"
            )
            for pp in over
        }
        over = {pp: b for pp, b in over.items() if kept[pp] > 0}
        if not over:
            break
        worst = max(r.predicted_peak_bytes for r in roles)
        note = f"predicted peak {worst / GIB:.2f} GiB > budget {budget / GIB:.2f} GiB"
        for pp, b in over.items():
            free[pp] = free.get(pp, 0) + b
        roles, records = predict_roles(job, free=free, note=note, hardware=hardware)
    return Prediction(roles, records, free, note)


def _stages(roles: list[RolePrediction], pp_rank: int) -> list[int]:
    return next(r.stage_ids for r in roles if r.pp_rank == pp_rank)


def predict_roles(
    job: PlannedJob,
    *,
    free: dict[int, int] | None = None,
    note: str = "",
    hardware=None,
    worst_case: bool = True,
    timed_as: PlannedJob | None = None,
) -> tuple[list[RolePrediction], list[dict]]:
    """Every role's peak, and the plan.json entries of every stage. What is simulated and
    what is derived from simulations (large jobs, middle pipeline ranks): derived_roles.py.
    With a hardware profile every role also gets its step time (RolePrediction.time).
    worst_case=False skips the worst-case routing simulations of expert parallel (the
    layout search; worst_case_peak_bytes is then the planned peak). timed_as: a job that
    differs from `job` only in its local batch (more pipeline microbatches): the step time
    is that job's, from `job`'s per-action times run through `timed_as`'s schedule order
    (step_time/pipeline.py's order_for; the layout search simulates many-microbatch layouts this way)."""
    free = free or {}
    cfg, dims = job.cfg, job.dims
    variants = derived_roles.variants(job, bool(free))
    moe = worst_case and dims.ep > 1 and cfg.planning.memory_skew < dims.ep
    pool_job = simulation_pool.Job(
        variants,
        free,
        note,
        timer=RankTimer(hardware) if hardware is not None else None,
    )
    plans = [derived_roles.rank_plan(v, bool(free)) for v in variants]

    def tasks(v: int, ranks) -> list[simulation_pool.Task]:
        return [
            simulation_pool.Task(v, r, worst)
            for r in ranks
            for worst in ((False, True) if moe else (False,))
        ]

    steps = simulation_pool.run(
        pool_job, [t for v, plan in enumerate(plans) for t in tasks(v, plan.simulated)]
    )
    per_variant = []
    for v, plan in enumerate(plans):

        def role(r: int, v: int = v) -> RolePrediction:
            planned = steps[simulation_pool.Task(v, r, False)]
            worst = steps.get(simulation_pool.Task(v, r, True), planned)
            return RolePrediction(
                f"pp{r}" if dims.pp > 1 else "all",
                ranks_of_pp_rank(dims, r),
                r,
                planned.stage_ids,
                planned.peak_bytes,
                max(worst.peak_bytes, planned.peak_bytes),
                planned.peak_at,
                planned.breakdown,
                points=planned.points,
            )

        roles = {r: role(r) for r in plan.simulated}
        if plan.derived and not derived_roles.interpolable(roles, plan):
            steps.update(simulation_pool.run(pool_job, tasks(v, plan.derived)))
            roles.update({r: role(r) for r in plan.derived})
        for r in plan.derived:
            roles.setdefault(
                r, derived_roles.interpolated(roles, plan, r, ranks_of_pp_rank(dims, r))
            )
        per_variant.append([roles[r] for r in range(dims.pp)])
    if hardware is not None:
        role_times.add_times(
            per_variant[0],
            steps,
            len(variants),
            job if timed_as is None else timed_as,
            hardware,
            reorder=timed_as is not None,
        )
    if len(variants) == 1:
        records = []
        for r in range(dims.pp):
            step = steps.get(simulation_pool.Task(0, r, False))
            records += (
                step.plan_records
                if step is not None
                else [
                    p.record()
                    for p in resolve_parts(
                        job, r, free_bytes=free.get(r, 0), budget_note=note
                    ).plans
                ]
            )
        return per_variant[0], records
    counts = derived_roles.blocks_per_stage(job)
    roles = [
        dataclasses.replace(derived_roles.extrapolated(r1, r2, c), time=r1.time)
        for r1, r2, c in zip(*per_variant, counts)
    ]
    own = job.with_model(copy.deepcopy(job.model)) if dims.pp == 1 else job
    records = [plan.record() for r in range(dims.pp) for plan in resolve_parts(own, r).plans]
    return roles, records


def role_table(roles: list[RolePrediction], budget: int | None) -> str:
    """The dry run's per-role table (GiB)."""
    shown = [c for c in CATEGORIES if any(r.breakdown.get(c) for r in roles)]
    short = {
        "parameters": "params",
        "optimizer_states": "adamw",
        "gradients": "grads",
        "unsharded_parameters": "gathered",
        "activations": "activ",
        "logits_and_loss": "logits",
        "backward_transients": "bwd tmp",
        "ep_dispatch": "ep a2a",
        "pipeline_buffers": "pp bufs",
        "optimizer_transients": "opt tmp",
        "inputs_and_buffers": "buffers",
        "checkpoint_staging": "ckpt stage",
    }
    head = ["role", "ranks", "peak GiB"] + [short[c] for c in shown] + ["worst GiB", "peak at"]
    rows = [head]
    for r in roles:
        ranks = (
            f"{r.ranks[0]}..{r.ranks[-1]} ({len(r.ranks)})"
            if len(r.ranks) > 3
            else ",".join(map(str, r.ranks))
        )
        rows.append(
            [r.role, ranks, f"{r.predicted_peak_bytes / GIB:.3f}"]
            + [f"{r.breakdown.get(c, 0) / GIB:.3f}" for c in shown]
            + [f"{r.worst_case_peak_bytes / GIB:.3f}", r.peak_at]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = [
        "  ".join(
            c.ljust(w) if i in (0, 1, len(head) - 1) else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths))
        )
        for row in rows
    ]
    lines.insert(1, "-" * len(lines[0]))
    if budget is not None:
        over = [r.role for r in roles if r.predicted_peak_bytes > budget]
        lines.append(
            f"budget {budget / GIB:.3f} GiB per rank: "
            + (f"OVER for {', '.join(over)}" if over else "every role fits")
        )
    return "\n".join(lines)
