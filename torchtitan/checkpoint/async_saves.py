"""Asynchronous checkpoint saves ([checkpoint] async_mode = "async"), with DCP's async_save.

A save first copies ("stages") this rank's checkpoint state into host memory - the only part
that stops training - then writes it from a background thread while the next steps run. Its
collectives (DCP's planning and its final gather of every rank's write results) go over a gloo
group of their own, created at the first save on every rank, so that they never interleave with
the training's collectives. The staging buffers are kept from one save to the next (DCP's
stager reuses them by source storage): from the first save on, every rank holds a second copy
of its parameters and optimizer states - pinned host memory on CUDA, the same memory as
training on CPU - which the memory prediction counts (checkpoint_staging).

Rules: one save in flight (a save first waits for the previous one); the last save and a
preemption save are synchronous (checkpoint.py). A save becomes step-N only once rank 0's
future has completed - DCP completes it after every rank's files and the metadata are written -
and rank 0 has written the marker and renamed the folder (`finish`); until then it is
step-N.tmp, which is never loaded, so a rank killed during the write leaves nothing that loads.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

from torchtitan.checkpoint.files import CheckpointError
from torchtitan.distributed.process_groups import is_comm_failure
from torchtitan.messages import one_line


@dataclass
class _Pending:
    step: int
    future: object  # concurrent.futures.Future of DCP's save
    finish: Callable[[], None]  # rank 0's marker + rename (checkpoint.py)
    started: float  # time.monotonic() when the background write began
    staged_s: float


class AsyncSaves:
    def __init__(self, device_type: str, timeout_seconds: int):
        self.device_type = device_type
        self.timeout = timedelta(seconds=timeout_seconds)
        self._group = None
        self._stager = None
        self.pending: _Pending | None = None
        self.write_s = 0.0  # the longest background write so far

    def start(self, step: int, states: dict, writer, finish: Callable[[], None]) -> float:
        """Stage `states` and start writing them with `writer`; returns the staging seconds."""
        if self._group is None:
            self._group = dist.new_group(backend="gloo", timeout=self.timeout)
            cuda = self.device_type == "cuda"
            self._stager = DefaultStager(
                StagingOptions(
                    use_pinned_memory=cuda,
                    use_shared_memory=False,
                    use_async_staging=False,
                    use_non_blocking_copy=cuda,
                )
            )
        start = time.monotonic()
        future = dcp.async_save(
            states, storage_writer=writer, process_group=self._group, async_stager=self._stager
        )
        staged = time.monotonic() - start
        self.pending = _Pending(step, future, finish, start + staged, staged)
        return staged

    def poll(self) -> str | None:
        """Between steps, on every rank: publish a save whose write has completed (rank 0),
        and return its log line; a failed one is left for wait() (every rank sees it fail)."""
        p = self.pending
        if p is None or not p.future.done() or p.future.exception() is not None:
            return None
        return self._finish()

    def wait(self) -> str | None:
        """Block until the save in flight is written, publish it; its log line (None if none)."""
        p = self.pending
        if p is None:
            return None
        try:
            p.future.result()
        # broad on purpose: a background write can fail in any way (disk, permissions, a worker's
        # error); each becomes one CheckpointError with the cause chained (its traceback kept)
        except (Exception, CheckpointException) as e:
            self.pending = None
            if is_comm_failure(e):
                raise
            failures = list(getattr(e, "failures", {}).values())
            first = failures[0][0] if failures and isinstance(failures[0], tuple) else e
            raise CheckpointError(
                f"the asynchronous save of step {p.step} failed ({type(first).__name__}:"
                f" {one_line(first)}); the checkpoints saved before it are intact"
            ) from e
        return self._finish()

    def _finish(self) -> str:
        p, self.pending = self.pending, None
        p.finish()
        took = time.monotonic() - p.started
        self.write_s = max(self.write_s, took)
        return (
            f"checkpoint step-{p.step} written in the background in {took:.2f}s"
            f" (training stopped {p.staged_s:.2f}s to stage it)"
        )

    def close(self) -> None:
        """Free the staging buffers (after the last save was waited for)."""
        if self._stager is not None:
            self._stager.close()
            self._stager = None
