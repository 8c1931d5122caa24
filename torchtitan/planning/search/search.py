"""`--job.dry_run=true --planning.fit=layout`: which layout of this model on these devices is fastest.

Staged so that a 2,048-device job is searched in minutes on one CPU:

1. Enumerate (layout_space.py): degrees, schedule and microbatch, AC mode, reshard policy and
   local batch under the job's global batch; typically 10^3 - 10^5 layouts.
2. Prune by the model-states floor (model_states.py, exact and torch-free): a layout whose
   busiest rank's parameters, gradients and AdamW states alone exceed the budget cannot fit.
   Computed once per (degrees, pipeline split): AC, reshard and batch do not change it.
3. Order by the cheap estimate (cheap_step.py, microseconds per layout), dropping layouts
   whose cheap peak exceeds the budget by more than CHEAP_MEMORY_SLACK (the estimate is
   rough; the full prediction decides).
4. Simulate in full the best `planning.layout_candidates` of that order that the pre-launch
   checks accept (one prediction per layout, as the dry run predicts a job: every role's
   peak and step time on the hardware profile), and the layout as configured. Within a
   layout the prediction shares what the dry run shares (middle pipeline ranks simulated
   once, long stages from 1- and 2-block simulations: derived_roles.py); expert-parallel
   jobs are simulated at the planned routing only (the worst case the dry run reports
   beside it is left out here); pipelines of many microbatches are simulated at the fewest
   that reach the schedule's steady state and timed through the real count's schedule.
   After each full simulation the cheap estimates left are
   rescaled by the median ratio of full to cheap found so far (compute time: the cheap
   model leaves out eager overheads and small ops; peak memory: the ratio of layouts of the
   same degrees where one was simulated) and reordered; those whose rescaled peak exceeds
   the budget are dropped; a layout's cheap tokens/s counts 10% less
   for each earlier simulation of its degrees (dp_replicate, dp_shard, tp, pp, cp, ep), so
   the full simulations spread over the degrees the cheap order favours. The layout as
   configured is simulated first (the reference); no simulation starts that could end after
   `planning.layout_seconds` of them (judged by the longest so far).
5. Rank the simulated layouts that fit by predicted tokens/s per device (the slowest role),
   print the top 10 with their exact overrides, and write the best as a TOML snippet.

The cheap order is checked against the full one on every search: the search prints the
fraction of simulated pairs the two order differently and where the full winner stood in
the cheap order.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import os
import time
from dataclasses import dataclass

from torchtitan.distributed.job_shape import Degrees
from torchtitan.planning.search import estimate as cheap_step
from torchtitan.planning.search import space as layout_space
from torchtitan.planning.search.space import Layout
from torchtitan.training.planned_job import PlannedJob
from torchtitan.units import GIB

CHEAP_MEMORY_SLACK = 1.1  # keep layouts whose cheap peak is at most this times the budget
DIVERSITY_PENALTY = 0.1  # per earlier full simulation of the same degrees (stage 4)


@dataclass
class Candidate:
    layout: Layout
    cheap: cheap_step.Estimate
    cheap_rank: int  # 1-based place in the cheap order (0: the layout as configured, not in it)
    states_bytes: int
    configured: bool = False  # the layout the job was configured with
    tokens_per_second: float | None = (
        None  # full prediction: the slowest role's tokens/s per device
    )
    step_seconds: float | None = None
    mfu: float | None = None
    peak_bytes: int | None = None
    breakdown: dict | None = None
    scaled: cheap_step.Estimate | None = None  # the cheap estimate rescaled by the full simulations

    def record(self, global_batch: int) -> dict:
        return {
            "layout": self.layout.short(),
            "overrides": self.layout.overrides(global_batch),
            "configured": self.configured,
            "cheap_rank": self.cheap_rank,
            "cheap_tokens_per_second_per_device": self.cheap.tokens_per_second_per_device,
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
    after_cheap_memory: int
    checked: int
    simulated: list[Candidate]
    ranked: list[Candidate]  # simulated, fitting, fastest first
    budget_bytes: int
    seconds: dict
    disagreement: (
        float | None
    )  # fraction of simulated pairs the cheap order gets the wrong way round
    stopped: bool = False  # the full stage ran out of planning.layout_seconds


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


def cheap_order(job: PlannedJob, hw, budget: int) -> tuple[list[Candidate], int, int, int, int]:
    """Stages 1-3: (candidates best first, enumerated, after the states floor, after the cheap
    memory estimate, global batch)."""
    from torchtitan.planning.memory.model_states import model_shapes

    cfg, args = job.cfg, job.args
    global_batch = job.batch.global_batch
    shapes = model_shapes(cfg.model.name, args)
    facts = cheap_step.model_facts(shapes, args)
    layouts = layout_space.enumerate_layouts(
        job.dims.world_size,
        hw.gpus_per_node,
        global_batch=global_batch,
        seq_len=cfg.training.seq_len,
        n_layers=args.n_layers,
        n_experts=args.moe.n_routed_experts if args.moe else 0,
    )
    cache: dict = {}
    fitting, kept = 0, []
    for lay in layouts:
        states = _states(job, shapes, lay, cache)
        if states is None or states > budget:
            continue
        fitting += 1
        est = cheap_step.estimate(
            lay,
            facts,
            states,
            hw,
            seq_len=cfg.training.seq_len,
            global_batch=global_batch,
            compiled=cfg.compile.enable,
        )
        if est.peak_bytes <= CHEAP_MEMORY_SLACK * budget:
            kept.append((est, lay, states))
    kept.sort(key=lambda t: -t[0].tokens_per_second_per_device)
    cands = [
        Candidate(lay, est, i + 1, states, scaled=est) for i, (est, lay, states) in enumerate(kept)
    ]
    return cands, len(layouts), fitting, len(kept), global_batch


def _full(job: PlannedJob, hw, cand: Candidate) -> None:
    """Stage 4 for one candidate: its prediction in a fake world of its own mesh."""
    import warnings

    from torchtitan.planning.memory.predict import predict_roles
    from torchtitan.training.build import fake_world

    # FSDP2 warns once per process that the embeddings return a view; every forked
    # simulation worker is a new process, so the search would repeat it hundreds of times
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")

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
            accum = global_batch // (d.dp * lay.local_batch)
            fewer = dataclasses.replace(lay, local_batch=fewest * lay.microbatch)
            sim, timed_as = layout_space.apply(cfg, fewer, fewer.local_batch * d.dp * accum), c

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
        _in_child(predicted)
    )


def _in_child(fn):
    """fn() in a forked child process, its result back through a pipe. Each layout's fake
    world lives and dies in its own process: DTensor caches sharding decisions by device
    meshes, which compare equal across worlds whatever their process groups, so a second
    world in one process gets plans naming the first one's destroyed groups."""
    import multiprocessing
    import traceback

    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)

    def child():
        try:
            send.send(("ok", fn()))
        except BaseException as e:  # broad on purpose: the parent re-raises it, traceback and all
            send.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        finally:
            send.close()

    proc = ctx.Process(target=child)
    proc.start()
    send.close()
    try:
        status, value = receive.recv()
    except EOFError:
        status, value = (
            "error",
            f"the simulation process died (exit code {proc.join() or proc.exitcode})",
        )
    proc.join()
    if status != "ok":
        raise RuntimeError(f"layout search: a full simulation failed: {value}")
    return value


def disagreement(cands: list[Candidate]) -> float | None:
    """Fraction of pairs of simulated candidates whose cheap (rescaled) and full tokens/s
    order differ."""
    done = [c for c in cands if c.tokens_per_second is not None]
    pairs = list(itertools.combinations(done, 2))
    if not pairs:
        return None
    wrong = sum(
        1
        for a, b in pairs
        if (a.scaled.tokens_per_second_per_device - b.scaled.tokens_per_second_per_device)
        * (a.tokens_per_second - b.tokens_per_second)
        < 0
    )
    return wrong / len(pairs)


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
    cfg, args = job.cfg, job.args
    t0 = time.perf_counter()
    cands, n_enum, n_states, n_cheap, global_batch = cheap_order(job, hw, budget)
    t1 = time.perf_counter()
    chosen: list[Candidate] = []
    if configured is not None:
        mine = next((c for c in cands if _same(c.layout, configured)), None)
        if mine is None:
            from torchtitan.planning.memory.model_states import model_shapes

            shapes = model_shapes(cfg.model.name, args)
            states = _states(job, shapes, configured, {}) or 0
            est = cheap_step.estimate(
                configured,
                cheap_step.model_facts(shapes, args),
                states,
                hw,
                seq_len=cfg.training.seq_len,
                global_batch=global_batch,
                compiled=cfg.compile.enable,
            )
            mine = Candidate(configured, est, 0, states)
        mine.configured = True
    pool, checked, check_s = list(cands), 0, 0.0
    time_scale, memory_scale = 1.0, 1.0
    stopped, failed, longest = False, [], 0.0
    if configured is not None:  # the reference, simulated first (its time counts in the budget)
        start = time.perf_counter()
        _full(job, hw, mine)
        longest = time.perf_counter() - start
        log(
            f"  [as configured] {mine.layout.short()}: {mine.tokens_per_second:,.0f} tok/s/dev,"
            f" peak {mine.peak_bytes / GIB:.2f} GiB ({longest:.1f}s)",
            flush=True,
        )
        chosen.append(mine)
    while len([c for c in chosen if not c.configured]) < n_full and pool:
        if (
            time.perf_counter() - t1 + longest > max_seconds
        ):  # the next might take the longest so far
            stopped = True
            break
        cand = pool.pop(0)
        if cand in chosen or cand in failed:
            continue
        checked += 1
        start = time.perf_counter()
        ok = accepts(layout_space.apply(cfg, cand.layout, global_batch))
        check_s += time.perf_counter() - start
        if not ok:
            continue
        start = time.perf_counter()
        log(
            f"  [{len(chosen) + 1}] cheap #{cand.cheap_rank} {cand.layout.short()}: ",
            end="",
            flush=True,
        )
        try:
            _full(job, hw, cand)
        except RuntimeError as e:  # one layout's simulation failing does not end the search
            log(f"failed, skipped ({str(e).splitlines()[0][:300]})", flush=True)
            failed.append(cand)
            continue
        chosen.append(cand)
        longest = max(longest, time.perf_counter() - start)
        log(
            f"{cand.tokens_per_second:,.0f} tok/s/dev, peak {cand.peak_bytes / GIB:.2f} GiB"
            f" ({time.perf_counter() - start:.1f}s)",
            flush=True,
        )
        # what the full simulations found rescales the rest: compute (the cheap model leaves
        # out eager overheads and small-op costs) and memory, by the median ratio so far
        time_scale = _median([_full_compute(c) / c.cheap.parts["compute"] for c in chosen])
        memory_scale = _median([c.peak_bytes / c.cheap.peak_bytes for c in chosen])
        by_degrees = collections.defaultdict(
            list
        )  # the memory ratio of layouts of the same degrees, where known
        for c in chosen:
            by_degrees[_degrees(c.layout)].append(c.peak_bytes / c.cheap.peak_bytes)
        for c in pool:
            c.scaled = c.cheap.rescaled(time_scale)
        pool = [
            c
            for c in pool
            if c.cheap.peak_bytes * _median(by_degrees.get(_degrees(c.layout)) or [memory_scale])
            <= budget
        ]
        # spread the simulations over the degrees: each earlier simulation of a layout's
        # degrees counts its cheap tokens/s DIVERSITY_PENALTY less (the cheap estimate is
        # surest between layouts of one set of degrees)
        seen = collections.Counter(_degrees(c.layout) for c in chosen)
        pool.sort(
            key=lambda c: (
                -c.scaled.tokens_per_second_per_device
                * (1 - DIVERSITY_PENALTY) ** seen[_degrees(c.layout)]
            )
        )
    for c in chosen:
        c.scaled = c.cheap.rescaled(time_scale)
    t2 = time.perf_counter()
    ranked = sorted(
        (c for c in chosen if c.peak_bytes <= budget), key=lambda c: -c.tokens_per_second
    )
    return SearchResult(
        n_enum,
        n_states,
        n_cheap,
        checked,
        chosen,
        ranked,
        budget,
        {"cheap": t1 - t0, "checks": check_s, "full": t2 - t1 - check_s},
        disagreement(chosen),
        stopped,
    )


def _degrees(lay: Layout) -> Degrees:
    return lay.degrees


def _median(values: list[float]) -> float:
    values = sorted(values)
    return values[len(values) // 2] if values else 1.0


def _full_compute(c: Candidate) -> float:
    b = c.breakdown or {}
    return max(b.get("compute", 0.0) + b.get("recompute", 0.0) + b.get("overhead", 0.0), 1e-12)


def _same(a: Layout, b: Layout) -> bool:
    """Equal but for the pipeline split points (a configured split counts as its layout's)."""
    return dataclasses.replace(a, split_points=()) == dataclasses.replace(b, split_points=())


def report(result: SearchResult, global_batch: int, top: int = 10) -> str:
    """The dry run's answer: the top layouts with their exact overrides."""
    r = result
    lines = [
        f"layout search: {r.enumerated:,} layouts enumerated, {r.after_states:,} within the model-states floor,"
        f" {r.after_cheap_memory:,} within the cheap memory estimate (x{CHEAP_MEMORY_SLACK} of the budget),"
        f" {r.checked} checked to take {len(r.simulated)} to full simulation"
        f" ({r.seconds['cheap']:.1f}s enumerate + cheap, {r.seconds['full']:.1f}s full"
        + (", stopped at planning.layout_seconds" if r.stopped else "")
        + ");"
        f" budget {r.budget_bytes / GIB:.2f} GiB per rank"
    ]
    if r.disagreement is not None:
        winner = r.ranked[0].cheap_rank if r.ranked else None
        lines.append(
            f"cheap vs full order: {r.disagreement:.0%} of simulated pairs ordered differently;"
            f" the full winner was #{winner} in the cheap order"
        )
    over = [c for c in r.simulated if c.peak_bytes > r.budget_bytes]
    if over:
        lines.append(
            f"{len(over)} simulated layout(s) over budget (the cheap estimate let them through)"
        )
    lines.append("")
    lines.append(
        f"{'#':>3}  {'tok/s/dev':>9}  {'MFU':>6}  {'peak GiB':>8}  {'step s':>7}  cheap#  layout"
    )
    for i, c in enumerate(r.ranked[:top]):
        mark = "  (as configured)" if c.configured else ""
        lines.append(
            f"{i + 1:>3}  {c.tokens_per_second:>9,.0f}  {(c.mfu or 0):>6.1%}  {c.peak_bytes / GIB:>8.2f}"
            f"  {c.step_seconds:>7.3f}  {c.cheap_rank or '-':>6}  {c.layout.short()}{mark}"
        )
    mine = next((c for c in r.simulated if c.configured), None)
    if mine is not None and mine not in r.ranked[:top]:
        place = (
            f"#{r.ranked.index(mine) + 1} of {len(r.ranked)}"
            if mine in r.ranked
            else f"over budget ({mine.peak_bytes / GIB:.2f} GiB)"
        )
        lines.append(
            f"  the layout as configured: {place}, {mine.tokens_per_second:,.0f} tok/s/dev, {mine.layout.short()}"
        )
    if r.ranked:
        lines.append(
            "\nbest layout's overrides:\n  " + " ".join(r.ranked[0].layout.overrides(global_batch))
        )
    return "\n".join(lines)


def toml_snippet(best: Layout, global_batch: int) -> str:
    """The best layout as TOML sections to paste into the job's config."""
    sections: dict[str, list[str]] = {}
    for flag in best.overrides(global_batch):
        key, value = flag[2:].split("=", 1)
        section, name = key.split(".", 1)
        if name == "pipeline_parallel_split_points":
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
