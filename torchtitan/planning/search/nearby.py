"""What the choices next to the job as configured would gain in step time and cost in memory
(the dry run's nearby table, with a hardware profile): each a whole job config, checked by the
caller's `accepts` and composed from the layout search's block probe (compose.py, probe.py):
its composed step and peak relative to the job's own composed figures, applied to the job's
full prediction. One probe (seconds) instead of one more simulation per choice; a choice
the composition does not cover (a layout outside the search's space, e.g. a zero-bubble
schedule) is simulated like the job."""

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
        f"nearby choices (composed from the block probe, relative to the job; the job as"
        f" configured: step {step:.3f}s,"
        f" {tps:,.0f} tok/s/dev, peak {peak / GIB:.2f} GiB):"
    ]
    records = []
    choices = nearby_choices(job)
    composed = _Composer(job, hardware, [c for _, c in choices if accepts(c)])
    for change, candidate in choices:
        if not accepts(candidate):
            lines.append(f"  {change:<70} refused by the checks")
            continue
        ratio = composed.relative(candidate)
        if ratio is not None:  # composed, relative to the job's own composed figures
            c_step, c_tps, c_peak = step * ratio[0], tps * ratio[1], int(peak + ratio[2])
        else:
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


class _Composer:
    """The layout search's composition for the nearby choices: one block probe per compile
    setting the choices need, for the AC modes they use."""

    def __init__(self, job: PlannedJob, hardware, cfgs: list):
        from torchtitan.dtypes import param_dtype
        from torchtitan.planning.memory.model_states import model_shapes
        from torchtitan.planning.search import compose

        self.job, self.hw = job, hardware
        self.shapes = model_shapes(job.cfg.model.name, job.args)
        self.model = compose.model_of(
            self.shapes,
            job.args,
            param_dtype(job.cfg.training.mixed_precision_param, job.target),
        )
        self.probes: dict[bool, dict] = {}
        self.states: dict = {}
        self.mine = None  # the job's own composed figures, once computed
        # the AC modes each compile setting needs (the job's and its choices')
        self.labels: dict[bool, set] = {}
        for cfg in [job.cfg, *cfgs]:
            lay = self._layout(cfg)
            if lay is not None:
                self.labels.setdefault(cfg.compile.enable, set()).add(lay.ac)

    def _layout(self, cfg):
        from torchtitan.planning.search import space as layout_space

        return layout_space.layout_of(
            cfg,
            self.job.dims.world_size,
            self.job.with_config(cfg).batch.global_batch,
            self.job.args.n_layers,
        )

    def _compose(self, cfg, lay):
        from torchtitan.planning.search import compose
        from torchtitan.planning.search import probe as block_probe
        from torchtitan.planning.search.search import _states
        from torchtitan.planning.search.space import SEARCH_AC

        compiled = cfg.compile.enable
        if compiled not in self.probes:
            job = self.job.with_config(cfg) if compiled != self.job.cfg.compile.enable else self.job
            labels = [label for label, _ in SEARCH_AC if label in self.labels[compiled]]
            d = self.job.dims
            self.probes[compiled] = block_probe.probe(
                job, self.hw, labels, self.model, tp=d.tp > 1, cp=d.cp > 1
            )
        states = _states(self.job, self.shapes, lay, self.states)
        return compose.compose(
            lay,
            self.model,
            self.probes[compiled],
            self.hw,
            seq=cfg.training.seq_len,
            global_batch=self.job.with_config(cfg).batch.global_batch,  # a choice may change it
            states_bytes=states or 0,
            compiled=compiled,
            skew=cfg.planning.memory_skew,
        )

    def relative(self, cfg) -> tuple[float, float, float] | None:
        """(step ratio, tokens/s ratio, peak bytes difference) of `cfg` vs the job, composed
        (a choice of more microbatches also moves more tokens); None when the composition
        does not cover it."""
        mine_lay, lay = self._layout(self.job.cfg), self._layout(cfg)
        if (
            mine_lay is None
            or lay is None
            or mine_lay.schedule not in ("", "1F1B", "Interleaved1F1B")
        ):
            return None
        if self.mine is None:
            self.mine = self._compose(self.job.cfg, mine_lay)
        got = self._compose(cfg, lay)
        return (
            got.step_seconds / self.mine.step_seconds,
            got.tokens_per_second_per_device / self.mine.tokens_per_second_per_device,
            got.peak_bytes - self.mine.peak_bytes,
        )
