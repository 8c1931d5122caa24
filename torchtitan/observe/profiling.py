"""torch.profiler traces and CUDA memory snapshots of chosen steps ([profiling] keys).

Every rank writes its own files under the dump folder:
    <save_traces_folder>/iteration_N/rank{R}_trace.json              (Chrome trace)
    <save_memory_snapshot_folder>/iteration_N/rank{R}_memory_snapshot.pickle   (CUDA only)
Step N is a multiple of profile_freq. A trace holds the profiler_active steps that end at N
(torch.profiler.schedule's active, upstream's key); the profiler_warmup steps before them warm
the profiler up (schedule's warmup), so the traced steps show steady-state work, not the
profiler's own start-up. A block of steps the run ends inside is not traced.

A trace of one step holds the training step alone (the span "ProfilerStep#N"), not the
validation or checkpoint save that may follow it: each iteration is two profiler windows, the
training step (window 2N) and what runs between steps (window 2N + 1), and only the first is
saved; a trace of several steps also holds what ran between them.
"""

import contextlib
import os
import warnings

import torch
from torch.profiler import ProfilerAction, record_function

# Each traced step is its own profiler cycle by design; torch warns that cycles do not accumulate.
warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle")

_SNAPSHOT_ENTRIES = 100_000  # allocator events kept for the memory snapshot


class Profiler:
    """A context manager around the training loop; each training step runs inside
    `with profiler.step(n):`."""

    def __init__(
        self,
        cfg,
        dump_folder: str,
        rank: int,
        device: torch.device,
        *,
        start_step: int,
        last_step: int,
        log,
    ):
        self.cfg, self.rank, self.device, self.log = cfg, rank, device, log
        self.trace_dir = os.path.join(dump_folder, cfg.save_traces_folder)
        self.snapshot_dir = os.path.join(dump_folder, cfg.save_memory_snapshot_folder)
        self.start_step, self.last_step = start_step, last_step
        self.prof = None
        self.snapshots = cfg.enable_memory_snapshot and device.type == "cuda"

    def __enter__(self):
        if self.cfg.enable_memory_snapshot and not self.snapshots:
            self.log(
                f"[torchtitan] profiling.enable_memory_snapshot is CUDA-only (this run is on {self.device.type}):"
                " no memory snapshot is written"
            )
        if self.snapshots:
            torch.cuda.memory._record_memory_history(max_entries=_SNAPSHOT_ENTRIES)
        if self.cfg.enable_profiling:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.device.type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self.prof = torch.profiler.profile(
                activities=activities,
                schedule=self._action,
                on_trace_ready=self._write_trace,
                record_shapes=True,
                with_stack=True,
            )
            self.prof.record_steps = False  # step() writes its own "ProfilerStep#N" span
            # Start in the window between steps before the first one (a resumed run: its start step).
            self.prof.step_num = 2 * self.start_step + 1
            self.prof.current_action = self._action(self.prof.step_num)
            self.prof.__enter__()
        return self

    def _train_action(self, step: int) -> ProfilerAction:
        """What the profiler does during training step `step`: within the profile_freq steps
        that end at a multiple of profile_freq, `active` steps recorded (the last one saves),
        after `warmup` steps warming up (the checks keep warmup + active <= profile_freq)."""
        freq, active = self.cfg.profile_freq, max(1, self.cfg.profiler_active)
        warmup = max(0, min(self.cfg.profiler_warmup, freq - active))
        before = (-step) % freq  # steps until the end of this step's block
        if step + before > self.last_step:
            return ProfilerAction.NONE  # the run ends before that block's trace would be saved
        if before == 0:
            return ProfilerAction.RECORD_AND_SAVE
        if before < active:
            return ProfilerAction.RECORD
        if before < active + warmup:
            return ProfilerAction.WARMUP
        return ProfilerAction.NONE

    def _action(self, window: int) -> ProfilerAction:
        step = window // 2
        if window % 2 == 0:
            return self._train_action(step)
        # Between steps: inside a trace of several steps, keep recording; else keep warming up
        # into a warmup or traced step (recorded, never saved). A traced step before it is
        # saved by leaving it.
        after, this = self._train_action(step + 1), self._train_action(step)
        if this == ProfilerAction.RECORD:
            return ProfilerAction.RECORD
        if after != ProfilerAction.NONE:
            return ProfilerAction.WARMUP
        return ProfilerAction.NONE

    def _write_trace(self, prof) -> None:
        step = prof.step_num // 2  # window 2N (a step that raised) or 2N + 1 (left normally)
        folder = os.path.join(self.trace_dir, f"iteration_{step}")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"rank{self.rank}_trace.json")
        prof.export_chrome_trace(path)
        self.log(f"[torchtitan] profiler trace of step {step} written to {path}")

    @contextlib.contextmanager
    def step(self, step: int):
        """Training step `step` runs inside this block."""
        if self.prof is None:
            yield
        else:
            self.prof.step()  # into window 2 * step
            with record_function(f"ProfilerStep#{step}"):
                yield
            self.prof.step()  # out of it: a traced step is saved here
        if self.snapshots and step % self.cfg.profile_freq == 0:
            self.dump_snapshot(f"iteration_{step}")

    def dump_snapshot(self, name: str) -> str:
        folder = os.path.join(self.snapshot_dir, name)
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"rank{self.rank}_memory_snapshot.pickle")
        torch.cuda.memory._dump_snapshot(path)
        self.log(f"[torchtitan] CUDA memory snapshot written to {path}")
        return path

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None and self.snapshots and issubclass(exc_type, torch.OutOfMemoryError):
            with contextlib.suppress(Exception):
                self.dump_snapshot("oom")
        if self.prof is not None:
            self.prof.__exit__(exc_type, exc, tb)
        if self.snapshots:
            torch.cuda.memory._record_memory_history(enabled=None)
        return False
