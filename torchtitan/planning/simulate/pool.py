"""The simulations of one prediction, run side by side on the machine's cores.

A prediction is a set of simulated steps (simulate.py): one per pipeline rank, per variant
of the job (the job itself, or its 1- and 2-block-per-stage reductions, predict.py), per
routing (planned and, with expert parallelism, worst case). They are independent once the
first pipeline stage's boundary metadata is known (simulation_patches.PipelineStartup), so they run
in two waves: every pipeline rank 0 first, then the rest with the metadata rank 0 learnt.

Workers are forked from this process: they inherit the model on meta and the fake process
group, and only small task records and results (shapes and byte counts) cross the pipe.
Results do not depend on the number of workers (`TITAN_MEMORY_WORKERS`, default: the cores
this process may use; 1 runs everything in this process).
"""

from __future__ import annotations

import multiprocessing
import os
import warnings
from dataclasses import dataclass, field

from torchtitan.planning.simulate.patches import PipelineStartup
from torchtitan.planning.simulate.step import SimulatedStep, simulate_pp_rank
from torchtitan.training.planned_job import PlannedJob

# FSDP2 warns once per process that the embeddings return a view (the models never write into
# it); every forked worker is a new process, so a dry run would print it once per simulation
warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")


@dataclass(frozen=True)
class Task:
    variant: int  # index into the variants (jobs) being simulated
    pp_rank: int
    worst: bool  # worst-case routing (every token copy of the EP group to one rank)


@dataclass
class Job:
    """What every task of one prediction shares (inherited by forked workers)."""

    variants: list[PlannedJob]  # the job, or its reductions (planning/simulate/roles.py)
    free: dict[int, int]  # per pipeline rank: kept bytes the budget frees (reshard auto)
    note: str
    startups: dict = field(default_factory=dict)  # variant -> the first stage's boundary metadata
    timer: object = (
        None  # planning/step_time/rank.py's RankTimer: the planned-routing steps are also timed
    )


_JOB: Job | None = None  # set while a wave runs; forked workers read it


def _run_one(task: Task) -> tuple[Task, SimulatedStep, object]:
    job = _JOB
    variant = job.variants[task.variant]
    startup = PipelineStartup()
    startup.forward = job.startups.get(task.variant)
    skew = variant.dims.ep if task.worst else variant.cfg.planning.memory_skew
    step = simulate_pp_rank(
        variant,
        task.pp_rank,
        startup,
        ep_skew=skew,
        free_bytes=job.free.get(task.pp_rank, 0),
        budget_note=job.note,
        timer=None if task.worst else job.timer,
    )
    return task, step, startup.forward


def workers(n_tasks: int) -> int:
    setting = os.environ.get("TITAN_MEMORY_WORKERS", "")  # checked by the config check
    n = (
        int(setting)
        if setting
        else len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else 1
    )
    if "fork" not in multiprocessing.get_all_start_methods():
        n = 1
    return max(1, min(n, n_tasks))


def _wave(tasks: list[Task]) -> list[tuple[Task, SimulatedStep, object]]:
    n = workers(len(tasks))
    if n == 1:
        return [_run_one(t) for t in tasks]
    # longest first (a 2-block variant's rank costs about twice a 1-block one's)
    ordered = sorted(tasks, key=lambda t: -_JOB.variants[t.variant].args.n_layers)
    with multiprocessing.get_context("fork").Pool(n) as pool:
        return pool.map(_run_one, ordered, chunksize=1)


def run(job: Job, tasks: list[Task]) -> dict[Task, SimulatedStep]:
    """Every task's simulated step: pipeline ranks 0 first (they learn the boundary
    metadata, kept in `job` for later calls), then the others, each wave over the workers."""
    global _JOB
    _JOB = job
    out: dict[Task, SimulatedStep] = {}
    try:
        for wave in ([t for t in tasks if t.pp_rank == 0], [t for t in tasks if t.pp_rank != 0]):
            for task, step, meta in _wave(wave):
                out[task] = step
                if meta is not None:
                    job.startups.setdefault(task.variant, meta)
    finally:
        _JOB = None
    return out
