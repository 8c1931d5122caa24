"""Step time, defined once, without a host sync per step.

On a GPU the host only queues a step's work and moves on; a step's host time says nothing
until the host waits for the device. It does so at sync points only (logging steps, the last
step, before a checkpoint save or a validation). So a step's time is the mean over a
WINDOW: the host time of the steps since the last sync point, the last of them ending with
the sync (when every queued kernel has run), divided by their number. Time between steps
(validation, checkpoint saves) is outside every window. On CPU every step is its own real
time, and the window's mean is the same figure.

Every figure derived from step time uses this: step_time, tokens/s and MFU in the log, the
hang watchdog's "longest step" (compilation left out: the watchdog pauses around it), and
the preemption note's estimate of a step.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class StepClock:
    """`begin()` / `end(synced)` around each step; `end` returns the window's mean step time
    at a sync point (None between)."""

    def __init__(self, paused_s: Callable[[], float] = lambda: 0.0):
        self._paused_s = paused_s  # seconds paused so far (the watchdog's pauses: compilation)
        self._start = self._paused_at_start = 0.0
        self._window_s = self._window_paused_s = 0.0
        self._steps = 0
        self.last_step_s = 0.0  # the mean step time of the last window
        self.last_window_steps = 0  # the steps in it
        self.longest_step_s = 0.0  # the longest window mean, pauses left out

    def begin(self) -> None:
        self._start, self._paused_at_start = time.monotonic(), self._paused_s()

    def end(self, synced: bool) -> float | None:
        self._window_s += time.monotonic() - self._start
        self._window_paused_s += self._paused_s() - self._paused_at_start
        self._steps += 1
        if not synced:
            return None
        self.last_step_s = self._window_s / self._steps
        self.last_window_steps = self._steps
        self.longest_step_s = max(
            self.longest_step_s, (self._window_s - self._window_paused_s) / self._steps
        )
        self._window_s = self._window_paused_s = 0.0
        self._steps = 0
        return self.last_step_s


class StepTimeCheck:
    """Predicted vs measured step time, logged once: the measured figure is the mean over the
    windows after the first sync point (step 1 compiles and warms up) until at least
    `steps` steps are in, e.g. steps 2-5 when every step logs."""

    def __init__(self, predicted_s: float | None, steps: int = 4):
        self.predicted_s, self.steps = predicted_s, steps
        self._seen_first = False
        self._total_s, self._n = 0.0, 0

    def at_sync(self, clock: StepClock) -> float | None:
        """After each sync point: the measured mean once enough steps are in (then never again)."""
        if self.predicted_s is None:
            return None
        if not self._seen_first:
            self._seen_first = True
            return None
        self._total_s += clock.last_step_s * clock.last_window_steps
        self._n += clock.last_window_steps
        if self._n < self.steps:
            return None
        self.predicted_s = None
        return self._total_s / self._n
