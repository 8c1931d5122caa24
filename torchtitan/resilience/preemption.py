"""Preemption: on SIGTERM or SIGUSR1, finish the step, checkpoint it, and exit 75.

A scheduler announces the end of a job with a signal: Slurm sends SIGTERM when it preempts or
cancels a job and at its time limit, then SIGKILL KillWait seconds later (30 by default);
`sbatch --signal=USR1@<s>` sends SIGUSR1 <s> seconds before the time limit. The signal may reach
only some ranks (a launcher passes it to its own node's ranks; a worker may be signalled
alone), so the handler only notes it, and at every step boundary the ranks agree with one
all-reduce (MAX) of one integer over the world group whether any of them was signalled. The
all-reduce is started at one boundary and read at the next (by then long done): no rank waits
for it and the device is not synchronised for it, at the price of stopping one step later. If
a rank was signalled, every rank checkpoints the step of the boundary where they read it (even
off the interval, synchronously) and the run ends with exit_status.EXIT_PREEMPTED.

The handlers are installed around the training loop only (`with preemption:`): before it
(start-up, nothing trained yet) and after it a signal keeps its default action and ends the
process at once, which is also what a launcher stopping the workers of a failed run expects.
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from torchtitan.resilience.hang_report import ranks_text

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
SLURM_KILL_WAIT_S = 30  # Slurm's default KillWait: SIGTERM to SIGKILL


@dataclass
class Stop:
    """What the ranks agreed on at a step boundary: who was signalled, with what, how long ago."""

    signals: dict[int, str]  # rank -> signal name, for the ranks that received one
    since_signal_s: float  # seconds from the earliest signal to the agreement

    def who(self) -> str:
        names = sorted(set(self.signals.values()))
        ranks = sorted(self.signals)
        return f"{'/'.join(names)} reached rank{'s' if len(ranks) > 1 else ''} {ranks_text(ranks)}"


class Preemption:
    """Signal flag + step-boundary agreement. `with preemption:` installs the handlers (main
    thread); `agree()` at each step boundary, on every rank, returns a Stop once the ranks know
    that one of them was signalled (one boundary after it), else None; `drain()` at the end."""

    def __init__(self, device: torch.device):
        self.device = device
        self.signum = 0
        self.received_at: float | None = None
        self._previous: dict[int, object] = {}
        self._pending: tuple | None = None  # the all-reduce started at the last boundary

    def _on_signal(self, signum, frame) -> None:
        if (
            not self.signum
        ):  # the first one counts; a repeat (Slurm and the launcher both) is the same request
            self.signum, self.received_at = signum, time.monotonic()

    def __enter__(self) -> Preemption:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc) -> bool:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        return False

    def agree(self) -> Stop | None:
        """At a step boundary, on every rank: the verdict of the all-reduce started at the
        previous boundary (a Stop when some rank had been signalled by then, else None), and,
        when it says go on, this boundary's all-reduce started."""
        if self._pending is not None:
            signalled = self._read(self._pending)
            self._pending = None
            if signalled:
                return self._stop()
        self._pending = self._start()
        return None

    def _start(self) -> tuple:
        flag = torch.tensor([self.signum], dtype=torch.int64, device=self.device)
        work = dist.all_reduce(flag, op=dist.ReduceOp.MAX, async_op=True)
        if self.device.type != "cuda":
            return work, flag, None
        work.wait()  # the current stream waits for it; the host does not
        host = torch.empty(1, dtype=torch.int64, pin_memory=True)
        host.copy_(flag, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return None, host, done

    @staticmethod
    def _read(pending: tuple) -> bool:
        work, value, done = pending
        if done is not None:
            done.synchronize()  # only up to the copy queued at the last boundary
        else:
            work.wait()
        return int(value.item()) != 0

    def _stop(self) -> Stop:
        """Who was signalled and how long ago (gathered once, when stopping)."""
        age = time.monotonic() - self.received_at if self.received_at is not None else 0.0
        everyone: list = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, (self.signum, age))
        signals = {r: signal.Signals(s).name for r, (s, _) in enumerate(everyone) if s}
        return Stop(signals, max(a for s, a in everyone if s))

    def drain(self) -> None:
        """End of training, every rank: complete the all-reduce still in flight."""
        if self._pending is not None:
            self._read(self._pending)
            self._pending = None


def stop_line(
    stop: Stop,
    step: int,
    saved: str | None,
    save_s: float,
    total_s: float,
    *,
    not_saved: str = "checkpointing is off: --checkpoint.enable=false",
) -> str:
    """The one line a preempted run ends with (`not_saved`: why nothing was saved)."""
    if saved is None:
        what = f"nothing saved ({not_saved})"
    else:
        what = f"checkpoint {saved} saved in {save_s:.2f}s"
    return (
        f"preempted: {stop.who()}; stopped after step {step}, {what}, {total_s:.1f}s after the signal"
        f" (Slurm sends SIGKILL {SLURM_KILL_WAIT_S}s after SIGTERM unless KillWait says otherwise);"
        " exit 75: rerun the same command to resume"
    )


def kill_wait_note(save_s: float, step_s: float) -> str | None:
    """A line when a preemption would not fit in Slurm's default KillWait: the rest of a step
    and a synchronous save must end within it (about a second more to exit)."""
    need = save_s + step_s + 1.0
    if need <= SLURM_KILL_WAIT_S:
        return None
    return (
        f"a preemption needs about {need:.0f}s (a step {step_s:.1f}s + a save {save_s:.1f}s + exit) but Slurm"
        f" sends SIGKILL {SLURM_KILL_WAIT_S}s after SIGTERM by default: ask for more (partition GraceTime,"
        " KillWait) or signal earlier before the time limit (sbatch --signal=USR1@<seconds>)"
    )
