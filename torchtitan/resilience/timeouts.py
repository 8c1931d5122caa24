"""The hang watchdog's timing rules, torch-free: the checks and the watchdog share them."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torchtitan.config.job_config import Comm

AUTO_SHARE = 0.6  # hang_timeout_seconds "auto": this share of timeout_seconds
REPORT_INTERVALS = 6  # heartbeat intervals a report may take after the hang timeout


def heartbeat_interval(hang_timeout_s: float) -> float:
    """Seconds between a rank's heartbeats: a tenth of the hang timeout, within [0.5, 10]."""
    return min(10.0, max(0.5, hang_timeout_s / 10))


def longest_hang_timeout(timeout_s: int) -> int:
    """The longest whole hang timeout whose report still comes before the collective timeout:
    a report takes up to REPORT_INTERVALS heartbeat intervals (+1 s) after the timeout
    (detection, two intervals of watching the heartbeats, waiting for the other ranks'
    records). 0: none."""
    h = timeout_s - 1
    while h > 0 and h + REPORT_INTERVALS * heartbeat_interval(h) + 1 >= timeout_s:
        h -= 1
    return h


def shortest_collective_timeout(comm: Comm) -> int:
    """The collective timeout a hang report must beat: timeout_seconds, or train_timeout_seconds
    (from the second step on) when that is shorter."""
    train = (
        comm.timeout_seconds if comm.train_timeout_seconds == "auto" else comm.train_timeout_seconds
    )
    return min(comm.timeout_seconds, train)


def hang_timeout(comm: Comm) -> float:
    """[comm] hang_timeout_seconds with "auto" resolved (0: no watchdog): AUTO_SHARE of
    timeout_seconds, or the longest that leaves time for a report (0 when none does)."""
    if comm.hang_timeout_seconds != "auto":
        return float(comm.hang_timeout_seconds)
    timeout = shortest_collective_timeout(comm)
    return float(min(AUTO_SHARE * timeout, longest_hang_timeout(timeout)))
