"""Putting the prediction to work: the largest local batch / sequence that fits the memory
budget (`--planning.fit`, dry run) and the changes that would make an over-budget job fit
(printed by the trainer before it refuses to start). What the nearby choices would gain in
step time: planning/search/nearby.py.

Every candidate is a whole job config, checked by `accepts` (the caller's: the pre-launch
checks, so a value the layout cannot take is skipped, not guessed) and predicted by the same
simulation as the job.
Gradient accumulation steps are held fixed, so the global batch grows with the local batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from torchtitan.config.job_config import JobConfig
from torchtitan.planning.memory.predict import predict_roles
from torchtitan.training.planned_job import PlannedJob
from torchtitan.units import GIB

# The AC modes a fit and the layout search choose from: (short label, activation_checkpoint
# overrides), and the same with the labels the fit report prints
AC_CHOICES = (
    ("none", {"mode": "none"}),
    ("op", {"mode": "selective", "selective_ac_option": "op"}),
    ("layer2", {"mode": "selective", "selective_ac_option": "2"}),
    ("full", {"mode": "full"}),
)
AC_MODES = tuple(
    zip(("none", "op SAC", "layer SAC (every 2nd)", "full"), (v for _, v in AC_CHOICES))
)


def with_values(cfg, section: str, **values):
    return dataclasses.replace(
        cfg, **{section: dataclasses.replace(getattr(cfg, section), **values)}
    )


def with_local_batch(job: PlannedJob, local: int):
    """`job`'s config with local_batch_size = local and its accumulation steps kept."""
    cfg, dp = job.cfg, job.dims.dp
    accum = job.batch.accum_steps
    global_batch = "auto" if cfg.training.global_batch_size == "auto" else local * dp * accum
    return with_values(cfg, "training", local_batch_size=local, global_batch_size=global_batch)


Accepts = Callable[[JobConfig], bool]  # whether the checks let a candidate job run


def peak_of(job: PlannedJob, cfg: JobConfig, accepts: Accepts) -> int | None:
    """The largest role peak of the candidate job `cfg` (job.with_config); None when
    `accepts` refuses it."""
    if not accepts(cfg):
        return None
    roles, _ = predict_roles(job.with_config(cfg))
    return max(r.predicted_peak_bytes for r in roles)


def largest_fitting(
    job: PlannedJob, budget: int, key: str, accepts: Accepts
) -> tuple[int, int | None]:
    """(largest value of training.<key> whose peak fits `budget`, its peak); (0, None) if none."""

    def candidate(v: int):
        return (
            with_local_batch(job, v)
            if key == "local_batch_size"
            else with_values(job.cfg, "training", seq_len=v)
        )

    step = 1 if key == "local_batch_size" else 8
    best, best_peak, v, over = 0, None, step, None
    while over is None and v <= (1 << 20):
        peak = peak_of(job, candidate(v), accepts)
        if peak is not None and peak <= budget:
            best, best_peak, v = v, peak, v * 2
        elif peak is None and best == 0:
            v += step  # e.g. a pipeline needs a multiple of its microbatch count
        else:
            over = v
    lo, hi = best, over or best
    while hi - lo > step:  # invariant: lo fits (or 0), hi does not
        mid = (lo + hi) // 2 // step * step
        peak = peak_of(job, candidate(mid), accepts)
        if peak is not None and peak <= budget:
            lo, best, best_peak = mid, mid, peak
        else:
            hi = mid
    return best, best_peak


def fit_report(job: PlannedJob, budget, key: str, accepts: Accepts) -> tuple[str, dict]:
    """The dry run's `--planning.fit` answer: per AC mode, the largest value that fits."""
    if budget is None:
        return ("fit: no memory budget is known for this job; set --planning.memory_budget_gib", {})
    lines = [
        f"largest training.{key} that fits {budget.bytes / GIB:.3f} GiB per rank ({budget.origin}),"
        + (
            f" gradient accumulation held at {job.batch.accum_steps} step(s), so the global"
            " batch grows with it:"
            if key == "local_batch_size"
            else " same batch:"
        )
    ]
    found = {}
    for label, ac in AC_MODES:
        candidate = job.with_config(with_values(job.cfg, "activation_checkpoint", **ac))
        value, peak = largest_fitting(candidate, budget.bytes, key, accepts)
        found[label] = {"value": value, "predicted_peak_bytes": peak}
        lines.append(
            f"  AC {label:<22} {key} {value:>6}"
            + (f"  (predicted peak {peak / GIB:.3f} GiB)" if peak else "  (nothing fits)")
        )
    return "\n".join(lines), {
        "fit": {"key": key, "budget_bytes": budget.bytes, "by_ac_mode": found}
    }


def suggestions(job: PlannedJob, budget: int, accepts: Accepts) -> list[str]:
    """Changes that would fit an over-budget job, each with its predicted peak (GiB)."""
    cfg, dims = job.cfg, job.dims
    out = []
    ac = cfg.activation_checkpoint
    for _label, values in AC_MODES:
        if (
            values["mode"] == ac.mode
            and values.get("selective_ac_option", ac.selective_ac_option) == ac.selective_ac_option
        ):
            continue
        peak = peak_of(job, with_values(cfg, "activation_checkpoint", **values), accepts)
        if peak is not None and peak <= budget:
            flags = " ".join(f"--activation_checkpoint.{k}={v}" for k, v in values.items())
            out.append(f"{flags} ({peak / GIB:.2f} GiB)")
    if cfg.parallelism.reshard_after_forward != "always" and dims.dp_shard > 1:
        peak = peak_of(
            job, with_values(cfg, "parallelism", reshard_after_forward="always"), accepts
        )
        if peak is not None and peak <= budget:
            out.append(f"--parallelism.reshard_after_forward=always ({peak / GIB:.2f} GiB)")
    if dims.pp > 1 and cfg.parallelism.pipeline_parallel_microbatch_size > 1:
        peak = peak_of(
            job, with_values(cfg, "parallelism", pipeline_parallel_microbatch_size=1), accepts
        )
        if peak is not None and peak <= budget:
            out.append(f"--parallelism.pipeline_parallel_microbatch_size=1 ({peak / GIB:.2f} GiB)")
    local, peak = largest_fitting(job, budget, "local_batch_size", accepts)
    if local and local < cfg.training.local_batch_size:
        out.append(f"--training.local_batch_size={local} ({peak / GIB:.2f} GiB)")
    return out
