"""Python's garbage collector on a schedule ([training] gc_freq, gc_debug).

Left to itself the collector runs whenever allocations cross its thresholds, at a different
moment on each rank; a rank collecting mid-step makes every other rank wait for it at the next
collective. With gc_freq > 0 automatic collection is off and every rank collects after the
same steps, between two steps. As upstream's, a collection is of the young generations (0
and 1: what a step leaves behind, milliseconds), at start-up too; only gc_debug runs full
ones, which walk every object of the process (~0.2-1 s with torch loaded, and in a process
forked from another they write to every page the two share). Loader workers keep the
automatic collector (data/dataloader.py).
"""

import gc
import logging
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)


class GarbageSchedule:
    """`after_step(step)` after every training step; `close()` gives the collector back.

    gc_freq: collect after every gc_freq-th step (0: Python's own schedule, nothing done
    here); debug: a full collection after every step. Each collection logs one line (as
    upstream's do): what it found and took; under debug also what is left."""

    def __init__(self, gc_freq: int, debug: bool = False, log: Callable[[str], None] | None = None):
        self.freq, self.debug = gc_freq, debug
        self.log = log or logger.info
        self.active = gc_freq > 0 or debug
        self.collections = 0  # collections run after steps (what the tests count)
        self.was_enabled = gc.isenabled()
        if self.active:
            gc.disable()
            gc.collect(1)  # the young generations start empty (older objects stay where they are)

    def after_step(self, step: int) -> int | None:
        """Collect when due; returns the unreachable objects found, None when not due."""
        if not self.active or not (self.debug or step % self.freq == 0):
            return None
        start = time.perf_counter()
        found = gc.collect() if self.debug else gc.collect(1)
        self.collections += 1
        ms = 1000 * (time.perf_counter() - start)
        line = f"[torchtitan] gc after step {step}: {found} unreachable objects, {ms:.1f} ms"
        if self.debug:  # what is left, and what the collector could not free
            counts = " ".join(str(n) for n in gc.get_count())
            line += f"; {len(gc.garbage)} uncollectable, generation counts {counts}"
        self.log(line)
        return found

    def close(self) -> None:
        if self.active and self.was_enabled:
            gc.enable()

    def __enter__(self) -> "GarbageSchedule":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False
