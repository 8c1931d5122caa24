"""`--job.dry_run=true --planning.fit=layout`: which layout of this model on these devices is fastest.

Every feasible layout is scored with the step-time model's own terms, then the best are
checked by the dry run's full simulation:

1. Enumerate (space.py): degrees, pipeline schedule (1F1B, Interleaved1F1B) and microbatch,
   AC mode (op SAC both ways: every matmul saved, or torchtitan's every 2nd recomputed),
   reshard policy and local batch under the job's global batch; 10^3 - 10^5 layouts.
2. Prune by the model-states floor (model_states.py, exact and torch-free): a layout whose
   busiest rank's parameters, gradients and AdamW states alone exceed the budget cannot fit.
3. Probe the model's block once per AC mode (probe.py: ~10 small simulations, seconds) and
   compose EVERY remaining layout's step time and peak from it (compose.py: the layout's
   GEMMs, attention, collectives on its mesh's links, the same overlap model and pipeline
   event simulation as the dry run; milliseconds per layout). A layout is feasible when its
   composed peak keeps HEADROOM of the budget free.
4. Rank the feasible layouts by composed tokens/s per device; walk the ranking: the first
   layout the pre-launch checks accept whose full simulation (the dry run's prediction)
   fits the budget is the pick. The best `planning.layout_candidates` accepted layouts are
   simulated in full (the pick among them) and printed beside their composed figures.
5. The certificate: how many layouts were scored and feasible, the pick, how far the next
   best is, and the layouts within the composed model's error band of the pick (measured
   on the layouts simulated in full) listed as ties: measure those on the cluster.

The pick depends only on the composed ranking, the checks and the full simulations of the
layouts before it in that ranking, none of which depend on the budget: a larger budget
keeps every layout a smaller one accepted, so it never returns a slower pick (by the
composed score). The layout as configured has no special place.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import time
from dataclasses import dataclass

from torchtitan.config.quantize_sections import FLOAT8_LINEAR, float8_linear_on
from torchtitan.distributed.job_shape import replica_groups
from torchtitan.dtypes import param_dtype
from torchtitan.planning.search import compose
from torchtitan.planning.search import space as layout_space
from torchtitan.planning.search.child import in_child
from torchtitan.planning.search.space import Layout
from torchtitan.training.planned_job import PlannedJob
from torchtitan.units import GIB

HEADROOM = 0.05  # of the budget a pick's composed peak leaves free (the composition's error)


@dataclass
class Candidate:
    layout: Layout
    composed: compose.Composed
    rank: int  # 1-based place in the composed ranking
    states_bytes: int
    configured: bool = False  # the layout the job was configured with
    tokens_per_second: float | None = None  # full prediction: the slowest role's tokens/s/device
    step_seconds: float | None = None
    mfu: float | None = None
    peak_bytes: int | None = None
    breakdown: dict | None = None

    def record(self, global_batch: int) -> dict:
        return {
            "layout": self.layout.short(),
            "overrides": self.layout.overrides(global_batch),
            "configured": self.configured,
            "rank": self.rank,
            "composed_tokens_per_second_per_device": self.composed.tokens_per_second_per_device,
            "composed_step_seconds": self.composed.step_seconds,
            "composed_peak_bytes": self.composed.peak_bytes,
            "tokens_per_second_per_device": self.tokens_per_second,
            "predicted_step_seconds": self.step_seconds,
            "mfu": self.mfu,
            "predicted_peak_bytes": self.peak_bytes,
            "breakdown": self.breakdown,
        }


@dataclass
class SearchResult:
    enumerated: int
    after_states: int
    scored: int  # layouts composed (every one within the states floor)
    feasible: int  # of them, composed peak within the budget less HEADROOM
    ranking: list[Candidate]  # feasible, fastest first by composed tokens/s
    simulated: list[Candidate]  # confirmed by the full simulation, in ranking order
    pick: Candidate | None
    refused: int  # layouts the checks refused while walking the ranking
    budget_bytes: int
    seconds: dict
    band: float  # the composed model's error on the simulated layouts (max |step ratio - 1|)
    ties: list[Candidate]  # feasible layouts within the band of the pick
    configured_note: str = ""


def _states(job: PlannedJob, shapes, layout: Layout, cache: dict) -> int | None:
    from torchtitan.distributed.job_shape import degrees
    from torchtitan.distributed.pipeline_layout import PipelineLayoutError, pipeline_layout
    from torchtitan.planning.memory import model_states

    key = (layout.degrees, layout.schedule, layout.split_points)
    if key not in cache:
        c = layout_space.apply(job.cfg, layout, job.batch.global_batch)
        try:
            # the states do not depend on the microbatch count: any the split accepts (the
            # checks refuse a count the schedule cannot take, later)
            split = pipeline_layout(c.parallelism, job.args.n_layers, 4 * layout.degrees.pp)
            ranks = model_states.rank_states(shapes, degrees(c, job.dims.world_size), split)
            cache[key] = model_states.busiest(ranks).total_bytes
        except (PipelineLayoutError, ValueError):
            cache[key] = None
    return cache[key]


def score(job: PlannedJob, hw, budget: int, log=print) -> tuple[list[Candidate], dict]:
    """Stages 1-3: every layout within the states floor, composed, fastest first (feasible
    or not); and counts and seconds."""
    import warnings

    from torchtitan.planning.memory.model_states import model_shapes
    from torchtitan.planning.search import probe as block_probe

    # FSDP2 warns once per process that the embeddings return a view; every forked
    # simulation (the probes, the full ones) is a new process, so the search would repeat it
    # hundreds of times
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")

    cfg, args = job.cfg, job.args
    global_batch = job.batch.global_batch
    # under fault tolerance a layout is one replica group's, training its share of the batch
    group_batch = global_batch // replica_groups(cfg)
    t0 = time.perf_counter()
    shapes = model_shapes(cfg.model.name, args)
    float8 = (False, True) if cfg.planning.layout_float8 == "choose" else (None,)
    layouts = layout_space.enumerate_layouts(
        job.dims.world_size,
        hw.gpus_per_node,
        global_batch=group_batch,
        replicate=not cfg.fault_tolerance.enable,
        seq_len=cfg.training.seq_len,
        n_layers=args.n_layers,
        n_experts=args.moe.n_routed_experts if args.moe else 0,
        float8=float8,
    )
    cache: dict = {}
    within = []
    for lay in layouts:
        states = _states(job, shapes, lay, cache)
        if states is not None and states <= budget:
            within.append((lay, states))
    t1 = time.perf_counter()
    plain = compose.model_of(
        shapes, args, param_dtype(job.cfg.training.mixed_precision_param, job.target)
    )
    models, probes = {}, {}
    acs = sorted({lay.ac for lay, _ in within})
    for f8 in float8:  # the job as configured, or float8 off and on (planning.layout_float8)
        f8_job = job if f8 is None else job.with_config(_with_float8(cfg, f8))
        models[f8] = dataclasses.replace(plain, float8=float8_of(f8_job.cfg, shapes))
        probes[f8] = block_probe.probe(f8_job, hw, acs, models[f8])
    t2 = time.perf_counter()
    log(
        f"  probe of the block: {len(acs)} AC modes"
        + (", float8 off and on" if len(float8) > 1 else "")
        + f" in {t2 - t1:.1f}s",
        flush=True,
    )
    cands = []
    for lay, states in within:
        got = compose.compose(
            lay,
            models[lay.float8],
            probes[lay.float8],
            hw,
            seq=cfg.training.seq_len,
            global_batch=group_batch,
            states_bytes=states,
            compiled=cfg.compile.enable,
            skew=cfg.planning.memory_skew,
        )
        cands.append(Candidate(lay, got, 0, states))
    cands.sort(key=lambda c: -c.composed.tokens_per_second_per_device)
    for i, c in enumerate(cands):
        c.rank = i + 1
    t3 = time.perf_counter()
    counts = {"enumerated": len(layouts), "within_states": len(within)}
    return cands, {**counts, "enumerate": t1 - t0, "probe": t2 - t1, "compose": t3 - t2}


def _with_float8(cfg, on: bool):
    converters = [FLOAT8_LINEAR] if on else []
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, converters=converters))


def float8_of(cfg, shapes) -> compose.Float8 | None:
    """What the composition needs of a job's float8 linears (None: the converter is off):
    the weights converted (the conversion's own filter on the shapes), its gathers."""
    from torchtitan.models.common.float8 import converted_weights

    if not float8_linear_on(cfg.model.converters):
        return None
    section = cfg.quantize.linear.float8
    block = max(shapes.blocks, key=lambda b: sum(p.numel for p in b))  # as compose times
    names = converted_weights(block + shapes.last, section, shapes.tied)
    recipe = section.recipe_name or "tensorwise"
    linears = [p for p in block if p.linear]
    return compose.Float8(
        frozenset(compose.local_name(n) for n in names),
        gather=section.enable_fsdp_float8_all_gather,
        # torchao's float8 styles take tensorwise Float8Linears, all of a group's
        tp=recipe == "tensorwise" and all(p.name in names for p in linears),
        wgrad=recipe != "rowwise_with_gw_hp",
    )


def _full(job: PlannedJob, hw, cand: Candidate) -> None:
    """Stage 4 for one candidate: its prediction in a fake world of its own mesh."""
    from torchtitan.planning.memory.predict import predict_roles
    from torchtitan.training.build import fake_world

    cfg, global_batch = job.cfg, job.batch.global_batch
    c = layout_space.apply(cfg, cand.layout, global_batch)
    sim, timed_as = c, None
    lay, d = cand.layout, cand.layout.degrees
    if d.pp > 1:
        # many microbatches: simulated at the fewest that reach the schedule's steady state
        # (the same microbatches in flight at the peak; every microbatch of a stage costs the
        # same), the step timed through the real count's order (predict_roles' timed_as)
        fewest = d.pp * (2 if lay.schedule == "Interleaved1F1B" else 1)
        if lay.local_batch // lay.microbatch > fewest:
            groups = replica_groups(cfg)
            accum = global_batch // (d.dp * groups * lay.local_batch)
            fewer = dataclasses.replace(lay, local_batch=fewest * lay.microbatch)
            rows = fewer.local_batch * d.dp * groups * accum
            sim, timed_as = layout_space.apply(cfg, fewer, rows), c

    def predicted() -> tuple:
        with fake_world(sim, job.dims.world_size) as dims:
            simulated = job.with_config(sim, dims=dims)
            roles, _ = predict_roles(
                simulated,
                hardware=hw,
                worst_case=False,
                timed_as=None if timed_as is None else simulated.with_config(timed_as),
            )
        slowest = min(roles, key=lambda r: r.time.tokens_per_second_per_device)
        t = slowest.time
        return (
            t.tokens_per_second_per_device,
            t.predicted_step_seconds,
            t.mfu,
            max(r.predicted_peak_bytes for r in roles),
            t.breakdown,
        )

    (cand.tokens_per_second, cand.step_seconds, cand.mfu, cand.peak_bytes, cand.breakdown) = (
        in_child(predicted)
    )


def search(
    job: PlannedJob,
    hw,
    budget: int,
    accepts,
    n_full: int,
    *,
    configured: Layout | None = None,
    log=print,
    max_seconds: float = float("inf"),
) -> SearchResult:
    """Stages 1-5 (module docstring) for `job` (its degrees without a mesh: each layout gets
    a fake world of its own)."""
    cfg = job.cfg
    global_batch = job.batch.global_batch
    cands, info = score(job, hw, budget, log)
    for c in cands:
        c.configured = configured is not None and _same(c.layout, configured)
    limit = budget * (1 - HEADROOM)
    ranking = [c for c in cands if c.composed.peak_bytes <= limit]
    t0 = time.perf_counter()
    simulated, refused, pick, check_s = [], 0, None, 0.0
    for cand in ranking:
        if len(simulated) >= n_full and pick is not None:
            break
        if time.perf_counter() - t0 > max_seconds:  # planning.layout_seconds
            break
        start = time.perf_counter()
        ok = accepts(layout_space.apply(cfg, cand.layout, global_batch))
        check_s += time.perf_counter() - start
        if not ok:
            refused += 1
            continue
        start = time.perf_counter()
        log(f"  [{len(simulated) + 1}] #{cand.rank} {cand.layout.short()}: ", end="", flush=True)
        try:
            _full(job, hw, cand)
        except RuntimeError as e:  # one layout's simulation failing does not end the search
            log(f"failed, skipped ({str(e).splitlines()[0][:300]})", flush=True)
            continue
        simulated.append(cand)
        log(
            f"{cand.tokens_per_second:,.0f} tok/s/dev (composed"
            f" {cand.composed.tokens_per_second_per_device:,.0f}), peak"
            f" {cand.peak_bytes / GIB:.2f} GiB (composed {cand.composed.peak_bytes / GIB:.2f})"
            f" ({time.perf_counter() - start:.1f}s)",
            flush=True,
        )
        if pick is None and cand.peak_bytes <= budget:
            pick = cand
    band = max(
        (abs(c.composed.step_seconds / c.step_seconds - 1) for c in simulated if c.step_seconds),
        default=0.0,
    )
    ties = []
    if pick is not None:
        floor = pick.composed.tokens_per_second_per_device * (1 - band)
        # below the pick in the ranking (those above it were refused or do not fit)
        after = ranking[ranking.index(pick) + 1 :]
        ties = [c for c in after if c.composed.tokens_per_second_per_device >= floor]
    note = ""
    if configured is not None and not any(c.configured for c in simulated):
        mine = next((c for c in cands if c.configured), None)
        note = (
            "outside the searched space or over the model-states floor"
            if mine is None
            else f"#{mine.rank:,} of {len(cands):,} scored, composed"
            f" {mine.composed.tokens_per_second_per_device:,.0f} tok/s/dev, peak"
            f" {mine.composed.peak_bytes / GIB:.2f} GiB"
            + (" (over the budget less the headroom)" if mine.composed.peak_bytes > limit else "")
        )
    info["full"] = time.perf_counter() - t0 - check_s
    info["checks"] = check_s
    return SearchResult(
        info["enumerated"],
        info["within_states"],
        len(cands),
        len(ranking),
        ranking,
        simulated,
        pick,
        refused,
        budget,
        info,
        band,
        ties,
        note,
    )


def _same(a: Layout, b: Layout) -> bool:
    """Equal but for the pipeline split points (a configured split counts as its layout's)."""
    return dataclasses.replace(a, split_points=()) == dataclasses.replace(b, split_points=())


def disagreement(cands: list[Candidate]) -> float | None:
    """Fraction of pairs of simulated candidates whose composed and full tokens/s order differ."""
    done = [c for c in cands if c.tokens_per_second is not None]
    pairs = list(itertools.combinations(done, 2))
    if not pairs:
        return None
    wrong = sum(
        1
        for a, b in pairs
        if (a.composed.tokens_per_second_per_device - b.composed.tokens_per_second_per_device)
        * (a.tokens_per_second - b.tokens_per_second)
        < 0
    )
    return wrong / len(pairs)


def report(result: SearchResult, global_batch: int, top: int = 10) -> str:
    """The dry run's answer: the certificate, the top layouts with their exact overrides."""
    r = result
    s = r.seconds
    lines = [
        f"layout search: {r.enumerated:,} layouts enumerated, {r.after_states:,} within the"
        f" model-states floor, {r.scored:,} scored (composed from the block probe), {r.feasible:,}"
        f" feasible (composed peak <= budget - {HEADROOM:.0%}); {len(r.simulated)} simulated in"
        f" full, {r.refused} refused by the checks on the way"
        f" ({s['enumerate']:.1f}s enumerate, {s['probe']:.1f}s probe, {s['compose']:.1f}s"
        f" compose, {s['full']:.1f}s full); budget {r.budget_bytes / GIB:.2f} GiB per rank",
    ]
    if r.pick is None:
        lines.append("no layout fits the budget")
        return "\n".join(lines)
    p = r.pick
    at = r.ranking.index(p)
    nxt = r.ranking[at + 1] if at + 1 < len(r.ranking) else None
    gap = (
        f"; the next best feasible (#{nxt.rank:,}, composed) is"
        f" {100 * (1 - nxt.composed.tokens_per_second_per_device / p.composed.tokens_per_second_per_device):.1f}% slower"
        if nxt is not None
        else ""
    )
    wrong = disagreement(r.simulated)
    above = p.rank - 1  # scored layouts ranked above the pick: over the budget, or refused
    lines.append(
        f"certificate: the pick is the fastest of the {r.feasible:,} feasible layouts the checks"
        f" accept and whose full simulation fits (#{p.rank:,} of {r.scored:,} scored; the"
        f" {above:,} above it are over the budget by their composed peak, refused by the checks"
        f" or over it in full){gap}; composed vs full on the {len(r.simulated)} simulated: step"
        f" time within {r.band:.1%}"
        + (f", {wrong:.0%} of their pairs ordered differently" if wrong is not None else "")
        + f"; {len(r.ties)} layout(s) within that band of the pick (ties: measure them)"
    )
    lines.append("")
    lines.append(
        f"{'#':>6}  {'tok/s/dev':>9}  {'composed':>9}  {'MFU':>6}  {'peak GiB':>8}  {'step s':>7}  layout"
    )
    for c in r.simulated[:top]:
        mark = "  <- pick" if c is p else ""
        mark += "  (as configured)" if c.configured else ""
        fits = "" if c.peak_bytes <= r.budget_bytes else "  (over budget)"
        lines.append(
            f"{c.rank:>6}  {c.tokens_per_second:>9,.0f}  {c.composed.tokens_per_second_per_device:>9,.0f}"
            f"  {(c.mfu or 0):>6.1%}  {c.peak_bytes / GIB:>8.2f}  {c.step_seconds:>7.3f}"
            f"  {c.layout.short()}{fits}{mark}"
        )
    if r.ties:
        lines.append(f"\nties within {r.band:.1%} of the pick (composed tok/s/dev):")
        for c in r.ties[:top]:
            lines.append(
                f"  #{c.rank:<5} {c.composed.tokens_per_second_per_device:>9,.0f}  {c.layout.short()}"
            )
        if len(r.ties) > top:
            lines.append(f"  ... and {len(r.ties) - top} more")
    if r.configured_note:
        lines.append(f"  the layout as configured: {r.configured_note}")
    lines.append("\nbest layout's overrides:\n  " + " ".join(p.layout.overrides(global_batch)))
    return "\n".join(lines)


def toml_snippet(best: Layout, global_batch: int) -> str:
    """The best layout as TOML sections to paste into the job's config."""
    sections: dict[str, list[str]] = {}
    for flag in best.overrides(global_batch):
        key, value = flag[2:].split("=", 1)
        section, name = key.split(".", 1)
        if name in ("pipeline_parallel_split_points", "converters"):  # lists
            value = "[" + ", ".join(f'"{v}"' for v in value.split(",") if v) + "]"
        elif not value.lstrip("-").isdigit() and value not in ("true", "false"):
            value = f'"{value}"'
        sections.setdefault(section, []).append(f"{name} = {value}")
    return "\n".join(f"[{s}]\n" + "\n".join(v) + "\n" for s, v in sections.items())


def write_snippet(folder: str, best: Layout, global_batch: int) -> str:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "best_layout.toml")
    with open(path, "w") as f:
        f.write("# the layout search's pick (--planning.fit=layout); paste into the job's config\n")
        f.write(toml_snippet(best, global_batch))
    return path
