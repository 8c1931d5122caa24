"""A load guard for the CPU timing checks (step_time_check.py, layout_pick_check.py): no
measurement while another job uses the machine.

A CPU check measures the model only if the cores it times are the cores the profile saw. Two
readings, both from /proc (Linux):

- before a job: `wait_quiet()` samples the cores other processes keep busy over a second and
  waits until they fall below QUIET_CORES; the 1-minute load average is logged beside it (it
  still carries the previous job, so it cannot be the test itself);
- during a job: `Window` reads the machine's busy CPU time and this process tree's own (every live
  descendant's user + system time, plus what its reaped children left in cutime/cstime) at the
  start and the end; the difference is what other processes used. A job that shared the
  machine with more than FOREIGN_CORES of other work is measured again.
"""

from __future__ import annotations

import os
import time

QUIET_CORES = 0.25  # busy cores (of the whole machine) that still count as idle
FOREIGN_CORES = 0.15  # average cores used by others during a job that void its measurement
_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _machine_busy_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def _tree_ticks(root: int) -> int:
    """User + system jiffies of `root` and its live descendants, with what each reaped."""
    parent, ticks = {}, {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        rest = stat[stat.rfind(")") + 2 :].split()  # the command may hold spaces
        pid = int(name)
        parent[pid] = int(rest[1])
        ticks[pid] = sum(int(x) for x in rest[11:15])  # utime stime cutime cstime
    total = 0
    for pid, t in ticks.items():
        p = pid
        while p > 1 and p != root:
            p = parent.get(p, 0)
        if p == root:
            total += t
    return total


def busy_cores(seconds: float = 1.0) -> float:
    """The cores other processes kept busy over `seconds`, averaged (this process tree's own
    work, such as a fork server importing, does not count)."""
    window = Window().start()
    time.sleep(seconds)
    return window.stop()


def wait_quiet(limit_s: float = 600.0, log=print) -> float:
    """Wait (up to limit_s) until the machine is idle but for QUIET_CORES; the seconds waited."""
    start = time.monotonic()
    said = False
    while True:
        busy = busy_cores()
        if busy < QUIET_CORES:
            return time.monotonic() - start
        if time.monotonic() - start > limit_s:
            log(f"[load guard] still {busy:.2f} cores busy after {limit_s:.0f}s: measuring anyway")
            return time.monotonic() - start
        if not said:
            log(
                f"[load guard] other processes keep {busy:.2f} cores busy (load average"
                f" {os.getloadavg()[0]:.2f}): waiting"
            )
            said = True
        time.sleep(4.0)


class Window:
    """The CPU time other processes used between start() and stop(), in average cores."""

    def start(self) -> Window:
        self.t = time.monotonic()
        self.busy, _ = _machine_busy_ticks()
        self.ours = _tree_ticks(os.getpid())
        return self

    def stop(self) -> float:
        wall = time.monotonic() - self.t
        busy, _ = _machine_busy_ticks()
        ours = _tree_ticks(os.getpid())
        foreign = (busy - self.busy) - (ours - self.ours)
        return max(0.0, foreign / _HZ / max(wall, 1e-3))
