"""The pipeline schedule in time (assumption 4 of model.py): an event simulation of every
pipeline rank's actions in the real schedule's order, each action as long as the simulated
step's ops of it took, starting when its rank is free and its input has arrived; on a CPU the
ranks share the cores (cpu_sharing.busy_rates). And the schedules' per-rank orders: torch's own
(`schedule_order`) and, for a microbatch count that was not simulated, `order_for`."""

from __future__ import annotations

_DEPENDS = {"F": ("F", -1), "B": ("B", +1), "I": ("I", +1)}


def pipeline_seconds(
    order: dict[int, list],
    stage_rank: dict[int, int],
    times: dict,  # pipeline rank -> its model.RankTimes
    p2p_s: float,
    n_stages: int,
    *,
    rates: tuple[float, ...] = (),
) -> tuple[float, dict[int, float]]:
    """(time the last rank finishes its actions, busy seconds per rank): an event simulation
    over `order` (rank -> its actions in order: (stage, kind, microbatch) or None for idle
    slots; kind F / B / I / W / R; "FB" an overlapped forward + backward pair given as a
    tuple of two actions). rates (busy_rates, a CPU's): the actions share the cores, each
    running at rates[k] while k ranks compute."""
    done: dict[tuple, float] = {}
    free = {r: 0.0 for r in order}
    busy = {r: 0.0 for r in order}
    queue = {r: [a for a in acts if a is not None] for r, acts in order.items()}
    pos = {r: 0 for r in order}

    def ready(action) -> float | None:
        stage, kind, mb = action
        if kind in ("F", "B", "I"):
            want, step = _DEPENDS[kind]
            src = stage + step
            if kind in ("B", "I") and src >= n_stages:
                return done.get((stage, "F", mb), 0.0) if (stage, "F", mb) in done else None
            if src < 0:
                return 0.0
            for k in (want,) if kind == "F" else ("B", "I"):
                if (src, k, mb) in done:
                    cross = stage_rank.get(src) != stage_rank.get(stage)
                    return done[(src, k, mb)] + (p2p_s if cross else 0.0)
            return None
        if kind == "W":
            return done.get((stage, "I", mb))
        return 0.0  # R: after the rank's previous actions

    def duration(rank: int, action) -> float:
        return times[rank].action(*action).seconds

    if rates:
        return _shared_pipeline(queue, ready, duration, rates, done)
    progress = True
    while progress:
        progress = False
        for r in order:
            while (nxt := _next(queue[r], pos[r], free[r], ready)) is not None:
                parts, start = nxt
                length = sum(duration(r, a) for a in parts)
                for a in parts:
                    done[a] = start + length
                free[r] = start + length
                busy[r] += length
                pos[r] += 1
                progress = True
    return _placed(queue, pos, free), busy


def _next(actions: list, pos: int, free: float, ready) -> tuple[list, float] | None:
    """A rank's next item (its actions, when it can start), None when it has none left or its
    input has not arrived yet."""
    if pos >= len(actions):
        return None
    item = actions[pos]
    parts = item if isinstance(item, list) else [item]
    starts = [ready(a) for a in parts]
    if any(s is None for s in starts):
        return None
    return parts, max([free, *starts])


def _placed(queue: dict[int, list], pos: dict[int, int], free: dict[int, float]) -> float:
    """The time the last rank finishes; fails when an action could not be placed."""
    if any(pos[r] < len(queue[r]) for r in queue):
        raise RuntimeError(
            "step-time model: the pipeline schedule's actions could not all be placed"
        )
    return max(free.values(), default=0.0)


def _shared_pipeline(
    queue: dict[int, list], ready, duration, rates, done: dict
) -> tuple[float, dict]:
    """pipeline_seconds on cores the ranks share: every running action advances at
    rates[number running]; the clock moves from one start or end to the next (`done`:
    action -> end, which `ready` reads)."""
    pos = {r: 0 for r in queue}
    free = {r: 0.0 for r in queue}
    busy = {r: 0.0 for r in queue}
    running: dict[int, list] = {}  # rank -> [work left (seconds at all ranks busy), start, parts]
    t = 0.0
    while True:
        later = []
        for r in queue:
            nxt = None if r in running else _next(queue[r], pos[r], free[r], ready)
            if nxt is None:
                continue
            parts, start = nxt
            if start <= t + 1e-15:
                running[r] = [sum(duration(r, a) for a in parts), t, parts]
            else:
                later.append(start)
        if not running:
            if not later:
                break
            t = min(later)
            continue
        rate = rates[min(len(running), len(rates) - 1)]
        step = min(w for w, _, _ in running.values()) / rate
        if later:
            step = min(step, min(later) - t)
        t += step
        for r in [r for r, run in running.items() if run[0] - step * rate <= 1e-15]:
            _, start, parts = running.pop(r)
            for a in parts:
                done[a] = t
            free[r], pos[r] = t, pos[r] + 1
            busy[r] += t - start
        for run in running.values():
            run[0] -= step * rate
    return _placed(queue, pos, free), busy


def single_stage_order(kind: str, n_ranks: int, n_microbatches: int) -> dict[int, list]:
    """GPipe and 1F1B as torch 2.13 runs them (PipelineScheduleSingle._step_microbatches; their
    `pipeline_order` grid is a drawing and numbers the later ranks' microbatches off by one):
    GPipe every forward then every backward; 1F1B min(microbatches, stages - rank) warm-up
    forwards, then one backward and one forward in turn, then the remaining backwards."""
    out = {}
    for r in range(n_ranks):
        if kind == "GPipe":
            out[r] = [(r, "F", i) for i in range(n_microbatches)] + [
                (r, "B", i) for i in range(n_microbatches)
            ]
            continue
        warm = min(n_microbatches, n_ranks - r)
        row = [(r, "F", i) for i in range(warm)]
        for i in range(n_microbatches):
            row.append((r, "B", i))
            if warm + i < n_microbatches:
                row.append((r, "F", warm + i))
        out[r] = row
    return out


def schedule_order(schedule) -> tuple[dict[int, list], int] | None:
    """Per pipeline rank, its compute actions in order as plain tuples, from torch's schedule."""
    from torch.distributed.pipelining.schedules import Schedule1F1B, ScheduleGPipe

    if isinstance(schedule, (Schedule1F1B, ScheduleGPipe)):
        n = schedule._num_stages
        kind = "GPipe" if isinstance(schedule, ScheduleGPipe) else "1F1B"
        return single_stage_order(kind, n, schedule._n_microbatches), n
    order = getattr(schedule, "pipeline_order", None)
    if not order:
        return None
    return _plain(order), schedule._num_stages


def _plain(order: dict) -> dict[int, list]:
    out = {}
    for rank, acts in order.items():
        row = []
        for a in acts:
            if a is None:
                continue
            kind = a.computation_type.value
            if kind == "OVERLAP_F_B" and a.sub_actions:
                row.append(
                    [
                        (s.stage_index, s.computation_type.value, s.microbatch_index)
                        for s in a.sub_actions
                    ]
                )
            elif kind in ("F", "B", "I", "W"):
                row.append((a.stage_index, kind, a.microbatch_index))
        out[rank] = row
    return out


def order_for(kind: str, n_ranks: int, n_microbatches: int) -> tuple[dict[int, list], int] | None:
    """The action order of a schedule for another microbatch count than was simulated (the
    layout search simulates many-microbatch layouts at fewer: every microbatch of a stage
    costs the same). GPipe, 1F1B and Interleaved1F1B (two stages per rank, torch's own
    order, computed without stages); None for the others."""
    if kind in ("GPipe", "1F1B"):
        return single_stage_order(kind, n_ranks, n_microbatches), n_ranks
    if kind != "Interleaved1F1B":
        return None
    from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B

    s = object.__new__(
        ScheduleInterleaved1F1B
    )  # its order needs only these (torch 2.13's __init__)
    s.pp_group_size, s.n_local_stages, s._n_microbatches = n_ranks, 2, n_microbatches
    s.number_of_rounds = max(1, n_microbatches // n_ranks)
    s.microbatches_per_round = n_microbatches // s.number_of_rounds
    return _plain({r: s._calculate_single_rank_operations(r) for r in range(n_ranks)}), 2 * n_ranks
