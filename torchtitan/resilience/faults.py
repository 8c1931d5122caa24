"""Fault injection for the failure tests: freeze, stall or slow a rank at a named point.

    TORCHTITAN_FAULT="stop@data:rank=2:step=4"           rank 2 freezes (SIGSTOP to itself)
                                                         just before it reads step 4's batches
    TORCHTITAN_FAULT="stop@step:rank=0:step=5"           rank 0 freezes inside step 5 (batches
                                                         read, before forward/backward)
    TORCHTITAN_FAULT="sleep=600@data:rank=1:step=3"      rank 1's data read takes 600 s (alive)
    TORCHTITAN_FAULT="sleep=30@checkpoint_write:step=6"  every rank's write of checkpoint 6
                                                         takes 30 s longer (an async save is
                                                         still writing while training goes on)

Several faults are separated by ';'; without rank= or step= a fault fires on every rank or
step. Points: data, step, checkpoint_write. Unset (always, outside tests), `point()` costs
one dictionary lookup. A freeze is real: the whole process stops, every thread with it, as a
rank does whose GPU driver or file system hangs; only SIGCONT or SIGKILL ends it.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass

logger = logging.getLogger(__name__)

ENV = "TORCHTITAN_FAULT"
POINTS = ("data", "step", "checkpoint_write")


@dataclass(frozen=True)
class Fault:
    action: str  # "stop" or "sleep"
    seconds: float
    point: str
    rank: int | None
    step: int | None


def parse(text: str) -> list[Fault]:
    """Faults of a TORCHTITAN_FAULT value; ValueError naming the part that is wrong."""
    faults = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        what, _, rest = part.partition("@")
        point, *conds = rest.split(":")
        action, _, value = what.partition("=")
        if (
            action not in ("stop", "sleep")
            or point not in POINTS
            or (action == "sleep") != bool(value)
        ):
            raise ValueError(
                f"{ENV}: '{part}': use stop@<point> or sleep=<seconds>@<point>, point one of"
                f" {', '.join(POINTS)}"
            )
        where = dict(c.split("=", 1) for c in conds if "=" in c)
        if set(where) - {"rank", "step"} or len(where) != len(conds):
            raise ValueError(f"{ENV}: '{part}': conditions are rank=<r> and step=<n>")
        try:
            seconds = float(value or 0)
            rank, step = (int(where[k]) if k in where else None for k in ("rank", "step"))
        except ValueError:
            raise ValueError(
                f"{ENV}: '{part}': seconds are a number, rank and step integers"
            ) from None
        if not 0 <= seconds < float("inf"):
            raise ValueError(f"{ENV}: '{part}': seconds are a number, rank and step integers")
        faults.append(Fault(action, seconds, point, rank, step))
    return faults


_cache: tuple[str, list[Fault]] = ("", [])


def point(name: str, step: int | None = None) -> None:
    """Fire the faults set for `name` (at `step`) on this rank."""
    global _cache
    text = os.environ.get(ENV, "")
    if not text:
        return
    if text != _cache[0]:  # read when first needed: a forked test rank gets its own environment
        _cache = (text, parse(text))
    rank = int(os.environ.get("RANK", "0"))
    for f in _cache[1]:
        if f.point == name and f.rank in (None, rank) and f.step in (None, step):
            logger.info(
                f"[torchtitan] fault injected ({ENV}): {f.action} at {name}, step {step}, rank {rank}"
            )
            if f.action == "stop":
                time.sleep(0.2)  # a freeze some way into the point, as a read that hangs
                os.kill(os.getpid(), signal.SIGSTOP)
            else:
                time.sleep(f.seconds)
