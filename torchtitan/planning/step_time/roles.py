"""The step time of every rank role of a prediction, from its simulated ranks' timed traces
(planning/step_time/rank.py): middle pipeline ranks take rank 1's times on their own stage;
jobs simulated at 1 and 2 blocks per stage (planning/simulate/roles.py) are extrapolated
linearly in the blocks, as their memory is; the roles are then run through the pipeline
schedule's order (planning/step_time/model.py)."""

from __future__ import annotations

from torchtitan.distributed.job_shape import replica_groups
from torchtitan.dtypes import param_dtype
from torchtitan.hardware import HardwareProfile
from torchtitan.planning.simulate import pool as simulation_pool
from torchtitan.planning.simulate import roles as derived_roles
from torchtitan.planning.step_time import cpu_sharing
from torchtitan.planning.step_time import model as step_time
from torchtitan.planning.step_time import pipeline as pipeline_time
from torchtitan.training.planned_job import PlannedJob


def add_times(
    roles: list,
    steps: dict,
    n_variants: int,
    job: PlannedJob,
    hardware: HardwareProfile,
    *,
    reorder: bool = False,
) -> None:
    """Set `role.time` of every role (RolePrediction) of `job` from `steps`, the prediction's
    simulated steps by simulation_pool.Task. reorder: time `job`'s pipeline order (more
    microbatches than were simulated; pipeline.order_for)."""
    cfg, dims = job.cfg, job.dims

    def times_of(v: int) -> dict[int, step_time.RankTimes]:
        out = {}
        for r in range(dims.pp):
            step = steps.get(simulation_pool.Task(v, r, False))
            if step is not None and step.times is not None:
                out[r] = step.times
        simulated = sorted(out)
        for r in range(dims.pp):
            if r not in out:  # a middle rank: alike stages (one per rank), as the nearest
                # simulated middle rank before it (the first of the run of alike ranks: with
                # the weighted ends, rank 1 may hold a block more than the ranks after it)
                src = max(k for k in simulated if 1 <= k < r)
                out[r] = out[src].restaged({src: r})
        return out

    per = [times_of(v) for v in range(n_variants)]
    times = per[0]
    if n_variants == 2:
        lo, hi = derived_roles.FROM_BLOCKS
        counts = derived_roles.blocks_per_stage(job)
        for r in range(dims.pp):
            x = (sum(counts[r]) / len(counts[r]) - lo) / (hi - lo)
            times[r] = per[0][r].combined(per[1][r], 1 - x, x)
    schedule = steps[simulation_pool.Task(0, 0, False)].schedule
    if reorder and dims.pp > 1:
        schedule = pipeline_time.order_for(
            cfg.parallelism.pipeline_parallel_schedule, dims.pp, job.microbatches
        )
    shape = job.batch
    # MFU against the datasheet peak of the dtype the matmuls run in (fp32 jobs: fp32's); bf16
    # jobs: the figure the trainer's measured MFU divides by (hardware.measured_peak_tflops)
    dtype = param_dtype(cfg.training.mixed_precision_param, job.target)
    peak = hardware.datasheet_flops(dtype)
    step_shape = step_time.StepShape(
        shape.global_batch * cfg.training.seq_len,
        dims.world_size * replica_groups(cfg),  # fault tolerance: the batch spans every group
        job.model.flops_per_token(cfg.training.seq_len),
        peak,
        shape.accum_steps,
        cpu_sharing.busy_rates(hardware, dims.world_size, dims.pp),
    )
    for role, rt in zip(
        roles,
        step_time.role_times(
            [(r.role, r.ranks, r.pp_rank) for r in roles], times, schedule, step_shape
        ),
    ):
        role.time = rt
