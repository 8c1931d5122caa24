"""Putting the prediction to work: the largest local batch / sequence that fits the memory
budget (`--job.fit`, dry run), the changes that would make an over-budget job fit
(printed by the trainer before it refuses to start), and what the nearby choices would
gain in step time and cost in memory (dry run, with a hardware profile).

Every candidate is a whole job config, checked by `accepts` (the caller's: the pre-launch
checks, so a value the layout cannot take is skipped, not guessed) and predicted by the same
simulation as the job.
Gradient accumulation steps are held fixed, so the global batch grows with the local batch.
"""

from __future__ import annotations

import dataclasses
from typing import Callable


from torchtitan.config.job_config import JobConfig
from torchtitan.distributed.job_shape import batch_shape
from torchtitan.memory.layout_space import AC_CHOICES
from torchtitan.memory.predict import predict_roles
from torchtitan.training.build import model_on_meta
from torchtitan.units import GIB

# AC modes a fit is searched for: (label, activation_checkpoint overrides), the layout
# search's choices (layout_space.AC_CHOICES) with the labels the fit report prints
AC_MODES = tuple(zip(("none", "op SAC", "layer SAC (every 2nd)", "full"), (v for _, v in AC_CHOICES)))


def _with(cfg, section: str, **values):
    return dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **values)})


def _with_local_batch(cfg, dims, local: int):
    """local_batch_size = local with the accumulation steps of `cfg` kept."""
    accum = batch_shape(cfg, dims.dp).accum_steps
    global_batch = "auto" if cfg.training.global_batch_size == "auto" else local * dims.dp * accum
    return _with(cfg, "training", local_batch_size=local, global_batch_size=global_batch)


Accepts = Callable[[JobConfig], bool]  # whether the checks let a candidate job run


def peak_of(spec, model, dims, cfg, target, args, accepts: Accepts) -> int | None:
    """The largest role peak of a candidate job; None when `accepts` refuses it."""
    if not accepts(cfg):
        return None
    if getattr(args, "max_seq_len", cfg.training.seq_len) != cfg.training.seq_len:  # RoPE tables follow seq_len
        args = dataclasses.replace(args, max_seq_len=cfg.training.seq_len)
        model = model_on_meta(cfg, args).model
    roles, _ = predict_roles(spec, model, dims, cfg, target, args)
    return max(r.predicted_peak_bytes for r in roles)


def largest_fitting(spec, model, dims, cfg, target, args, budget: int, key: str, accepts: Accepts
                    ) -> tuple[int, int | None]:
    """(largest value of training.<key> whose peak fits `budget`, its peak); (0, None) if none."""
    def candidate(v: int):
        return _with_local_batch(cfg, dims, v) if key == "local_batch_size" else _with(cfg, "training", seq_len=v)

    step = 1 if key == "local_batch_size" else 8
    best, best_peak, v, over = 0, None, step, None
    while over is None and v <= (1 << 20):
        peak = peak_of(spec, model, dims, candidate(v), target, args, accepts)
        if peak is not None and peak <= budget:
            best, best_peak, v = v, peak, v * 2
        elif peak is None and best == 0:
            v += step  # e.g. a pipeline needs a multiple of its microbatch count
        else:
            over = v
    lo, hi = best, over or best
    while hi - lo > step:  # invariant: lo fits (or 0), hi does not
        mid = (lo + hi) // 2 // step * step
        peak = peak_of(spec, model, dims, candidate(mid), target, args, accepts)
        if peak is not None and peak <= budget:
            lo, best, best_peak = mid, mid, peak
        else:
            hi = mid
    return best, best_peak


def fit_report(spec, model, dims, cfg, target, args, budget, key: str, accepts: Accepts) -> tuple[str, dict]:
    """The dry run's `--job.fit` answer: per AC mode, the largest value that fits."""
    if budget is None:
        return ("fit: no memory budget is known for this job; set --parallelism.memory_budget_gib", {})
    lines = [f"largest training.{key} that fits {budget.bytes / GIB:.3f} GiB per rank ({budget.origin}),"
             + (f" gradient accumulation held at {batch_shape(cfg, dims.dp).accum_steps} step(s), so the global"
                " batch grows with it:" if key == "local_batch_size" else " same batch:")]
    found = {}
    for label, ac in AC_MODES:
        candidate = _with(cfg, "activation_checkpoint", **ac)
        value, peak = largest_fitting(spec, model, dims, candidate, target, args, budget.bytes, key, accepts)
        found[label] = {"value": value, "predicted_peak_bytes": peak}
        lines.append(f"  AC {label:<22} {key} {value:>6}" + (f"  (predicted peak {peak / GIB:.3f} GiB)" if peak else
                                                             "  (nothing fits)"))
    return "\n".join(lines), {"fit": {"key": key, "budget_bytes": budget.bytes, "by_ac_mode": found}}


def suggestions(spec, model, dims, cfg, target, args, budget: int, accepts: Accepts) -> list[str]:
    """Changes that would fit an over-budget job, each with its predicted peak (GiB)."""
    out = []
    ac = cfg.activation_checkpoint
    for label, values in AC_MODES:
        if values["mode"] == ac.mode and values.get("selective_ac_option", ac.selective_ac_option) == ac.selective_ac_option:
            continue
        peak = peak_of(spec, model, dims, _with(cfg, "activation_checkpoint", **values), target, args, accepts)
        if peak is not None and peak <= budget:
            flags = " ".join(f"--activation_checkpoint.{k}={v}" for k, v in values.items())
            out.append(f"{flags} ({peak / GIB:.2f} GiB)")
    if cfg.parallelism.reshard_after_forward != "always" and dims.dp_shard > 1:
        peak = peak_of(spec, model, dims, _with(cfg, "parallelism", reshard_after_forward="always"), target, args, accepts)
        if peak is not None and peak <= budget:
            out.append(f"--parallelism.reshard_after_forward=always ({peak / GIB:.2f} GiB)")
    if dims.pp > 1 and cfg.parallelism.pipeline_parallel_microbatch_size > 1:
        peak = peak_of(spec, model, dims, _with(cfg, "parallelism", pipeline_parallel_microbatch_size=1), target, args, accepts)
        if peak is not None and peak <= budget:
            out.append(f"--parallelism.pipeline_parallel_microbatch_size=1 ({peak / GIB:.2f} GiB)")
    local, peak = largest_fitting(spec, model, dims, cfg, target, args, budget, "local_batch_size", accepts)
    if local and local < cfg.training.local_batch_size:
        out.append(f"--training.local_batch_size={local} ({peak / GIB:.2f} GiB)")
    return out


def nearby_choices(cfg, dims) -> list[tuple[str, JobConfig]]:
    """(override, candidate job) for the choices next to the job as configured: the AC modes
    on either side of its own (AC_MODES' order), reshard never / always (with FSDP), one
    microbatch more or fewer (with PP: the local batch +/- one microbatch, accumulation held),
    compile switched."""
    out = []
    ac = cfg.activation_checkpoint
    here = next((i for i, (_, v) in enumerate(AC_MODES) if v["mode"] == ac.mode
                 and v.get("selective_ac_option", ac.selective_ac_option) == ac.selective_ac_option), None)
    for j in (here - 1, here + 1) if here is not None else ():
        if 0 <= j < len(AC_MODES):
            values = AC_MODES[j][1]
            out.append((" ".join(f"--activation_checkpoint.{k}={v}" for k, v in values.items()),
                        _with(cfg, "activation_checkpoint", **values)))
    if dims.dp_shard > 1:
        for policy in ("never", "always"):
            if cfg.parallelism.reshard_after_forward != policy:
                out.append((f"--parallelism.reshard_after_forward={policy}",
                            _with(cfg, "parallelism", reshard_after_forward=policy)))
    if dims.pp > 1:
        mbs = cfg.parallelism.pipeline_parallel_microbatch_size
        for delta in (1, -1):
            local = cfg.training.local_batch_size + delta * mbs
            if local >= mbs:
                out.append((f"--training.local_batch_size={local}", _with_local_batch(cfg, dims, local)))
    out.append((f"--compile.enable={str(not cfg.compile.enable).lower()}", _with(cfg, "compile", enable=not cfg.compile.enable)))
    return out


def nearby_report(spec, model, dims, cfg, target, args, accepts: Accepts, hardware, roles) -> tuple[str, list[dict]]:
    """The dry run's table of the nearby choices: each predicted like the job (one more
    simulation each), beside the job's own step time and peak. Nothing about the job changes."""
    step = max(r.time.predicted_step_seconds for r in roles)
    tps = min(r.time.tokens_per_second_per_device for r in roles)
    peak = max(r.predicted_peak_bytes for r in roles)
    lines = [f"nearby choices (each predicted as the job; the job as configured: step {step:.3f}s,"
             f" {tps:,.0f} tok/s/dev, peak {peak / GIB:.2f} GiB):"]
    records = []
    for change, candidate in nearby_choices(cfg, dims):
        if not accepts(candidate):
            lines.append(f"  {change:<70} refused by the checks")
            continue
        got, _ = predict_roles(spec, model, dims, candidate, target, args, hardware=hardware)
        c_step = max(r.time.predicted_step_seconds for r in got)
        c_tps = min(r.time.tokens_per_second_per_device for r in got)
        c_peak = max(r.predicted_peak_bytes for r in got)
        records.append({"change": change, "predicted_step_seconds": c_step, "tokens_per_second_per_device": c_tps,
                        "predicted_peak_bytes": c_peak})
        lines.append(f"  {change:<70} step {c_step:.3f}s ({100 * (c_step - step) / step:+.1f}%),"
                     f" {c_tps:,.0f} tok/s/dev ({100 * (c_tps - tps) / tps:+.1f}%), peak {c_peak / GIB:.2f} GiB")
    return "\n".join(lines), records
