"""What a hang report says: which ranks stopped making progress and where the others wait.

Pure functions over what the ranks published (hang_watchdog.py), so they are tested without
processes. The rules:
- a rank whose heartbeat did not move while the reporter watched is silent: frozen (SIGSTOP,
  a kernel or driver that holds the whole process), dead, or never got to training; it cannot
  speak for itself, so its last heartbeat tells where it was seen last;
- with no silent rank, the ranks that passed the fewest progress points are behind the others
  (every rank passes the same points in the same order: data, step, optimizer ...), e.g. one
  stuck in its data read while the others wait for it in the step's first collective;
- one rank alone stopped, where it is;
- with neither, every rank waits at the same point: a collective the ranks disagree on (say an
  all-to-all with mismatched splits) or one that never completes; the stacks tell which.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass
class RankState:
    rank: int
    alive: bool  # its heartbeat moved during the observation
    seq: int  # progress points passed
    activity: str  # the last progress point, e.g. "step 7: data"
    quiet_s: float  # seconds since that point, as its last heartbeat said
    where: str = ""  # its main thread's innermost frames, when it published them
    host: str = ""
    silent_s: float = 0.0  # seconds since its last heartbeat (the writer's clock)


def ranks_text(ranks: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2,5,7-8'."""
    out, ranks = [], sorted(ranks)
    i = 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ",".join(out)


def culprits(states: list[RankState]) -> tuple[list[int], str]:
    """(the ranks that stopped making progress, why they are named)."""
    silent = [s.rank for s in states if not s.alive]
    if silent:
        return silent, "silent"
    least = min(s.seq for s in states)
    if len(states) == 1 or any(s.seq != least for s in states):
        return [s.rank for s in states if s.seq == least], "behind"
    return [], ""


def _plural(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {ranks_text(ranks)}"


def summary(states: list[RankState], hang_timeout_s: float, folder: str) -> str:
    """The one line of a hang report."""
    named, why = culprits(states)
    by_rank = {s.rank: s for s in states}
    if why == "silent":
        silent = max(by_rank[r].silent_s for r in named)
        last = sorted({by_rank[r].activity for r in named})
        head = (
            f"hang: {_plural(named)} stopped making progress and went silent (no heartbeat for {silent:.0f}s;"
            f" last seen in {' / '.join(last)})"
        )
    elif why == "behind":
        where = sorted(
            {
                f"{by_rank[r].activity}" + (f" at {by_rank[r].where}" if by_rank[r].where else "")
                for r in named
            }
        )
        head = f"hang: {_plural(named)} stopped making progress in {' / '.join(where)}"
    else:
        head = (
            f"hang: no rank is behind: all {len(states)} wait at the same point for over {hang_timeout_s:.0f}s"
            " (a collective the ranks disagree on, or one that never completes)"
        )
    waiting: dict[str, list[int]] = {}
    for s in states:
        if s.rank not in named and s.alive:
            waiting.setdefault(s.activity + (f" at {s.where}" if s.where else ""), []).append(
                s.rank
            )
    rest = "; ".join(
        f"{_plural(r)} {'wait' if len(r) > 1 else 'waits'} in {w}"
        for w, r in sorted(waiting.items(), key=lambda kv: min(kv[1]))
    )
    return f"{head}{'; ' + rest if rest else ''}; stacks in {folder}{os.sep}"


def table(states: list[RankState]) -> str:
    """Every rank's state, one line each (report.txt)."""
    rows = [
        f"{'rank':>5}  {'state':7}  {'host':12}  {'progress':>8}  {'quiet s':>7}  activity / where"
    ]
    for s in sorted(states, key=lambda s: s.rank):
        rows.append(
            f"{s.rank:>5}  {'alive' if s.alive else 'SILENT':7}  {s.host[:12]:12}  {s.seq:>8}  {s.quiet_s:>7.1f}"
            f"  {s.activity}" + (f" | {s.where}" if s.where else "")
        )
    return "\n".join(rows)
