"""What the choices next to the job as configured would gain in step time and cost in memory
(the dry run's nearby table, with a hardware profile): each a whole job config, checked by the
caller's `accepts` and predicted by the same simulation as the job."""

from __future__ import annotations

from torchtitan.config.job_config import JobConfig
from torchtitan.planning.memory.fit import AC_MODES, Accepts, with_local_batch, with_values
from torchtitan.planning.memory.predict import predict_roles
from torchtitan.training.planned_job import PlannedJob
from torchtitan.units import GIB


def nearby_choices(job: PlannedJob) -> list[tuple[str, JobConfig]]:
    """(override, candidate job's config) for the choices next to the job as configured: the
    AC modes on either side of its own (AC_MODES' order), reshard never / always (with FSDP),
    one microbatch more or fewer (with PP: the local batch +/- one microbatch, accumulation
    held), compile switched."""
    cfg, dims = job.cfg, job.dims
    out = []
    ac = cfg.activation_checkpoint
    here = next(
        (
            i
            for i, (_, v) in enumerate(AC_MODES)
            if v["mode"] == ac.mode
            and v.get("selective_ac_option", ac.selective_ac_option) == ac.selective_ac_option
        ),
        None,
    )
    for j in (here - 1, here + 1) if here is not None else ():
        if 0 <= j < len(AC_MODES):
            values = AC_MODES[j][1]
            out.append(
                (
                    " ".join(f"--activation_checkpoint.{k}={v}" for k, v in values.items()),
                    with_values(cfg, "activation_checkpoint", **values),
                )
            )
    if dims.dp_shard > 1:
        for policy in ("never", "always"):
            if cfg.parallelism.reshard_after_forward != policy:
                out.append(
                    (
                        f"--parallelism.reshard_after_forward={policy}",
                        with_values(cfg, "parallelism", reshard_after_forward=policy),
                    )
                )
    if dims.pp > 1:
        mbs = cfg.parallelism.pipeline_parallel_microbatch_size
        for delta in (1, -1):
            local = cfg.training.local_batch_size + delta * mbs
            if local >= mbs:
                out.append((f"--training.local_batch_size={local}", with_local_batch(job, local)))
    out.append(
        (
            f"--compile.enable={str(not cfg.compile.enable).lower()}",
            with_values(cfg, "compile", enable=not cfg.compile.enable),
        )
    )
    return out


def nearby_report(job: PlannedJob, accepts: Accepts, hardware, roles) -> tuple[str, list[dict]]:
    """The dry run's table of the nearby choices: each predicted like the job (one more
    simulation each), beside the job's own step time and peak. Nothing about the job changes."""
    step = max(r.time.predicted_step_seconds for r in roles)
    tps = min(r.time.tokens_per_second_per_device for r in roles)
    peak = max(r.predicted_peak_bytes for r in roles)
    lines = [
        f"nearby choices (each predicted as the job; the job as configured: step {step:.3f}s,"
        f" {tps:,.0f} tok/s/dev, peak {peak / GIB:.2f} GiB):"
    ]
    records = []
    for change, candidate in nearby_choices(job):
        if not accepts(candidate):
            lines.append(f"  {change:<70} refused by the checks")
            continue
        got, _ = predict_roles(job.with_config(candidate), hardware=hardware)
        c_step = max(r.time.predicted_step_seconds for r in got)
        c_tps = min(r.time.tokens_per_second_per_device for r in got)
        c_peak = max(r.predicted_peak_bytes for r in got)
        records.append(
            {
                "change": change,
                "predicted_step_seconds": c_step,
                "tokens_per_second_per_device": c_tps,
                "predicted_peak_bytes": c_peak,
            }
        )
        lines.append(
            f"  {change:<70} step {c_step:.3f}s ({100 * (c_step - step) / step:+.1f}%),"
            f" {c_tps:,.0f} tok/s/dev ({100 * (c_tps - tps) / tps:+.1f}%), peak {c_peak / GIB:.2f} GiB"
        )
    return "\n".join(lines), records
