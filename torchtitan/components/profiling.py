"""torch.profiler traces and CUDA memory snapshots of chosen steps ([profiling] keys).

Every rank writes its own files under the dump folder:
    <save_traces_folder>/iteration_N/rank{R}_trace.json              (Chrome trace)
    <save_memory_snapshot_folder>/iteration_N/rank{R}_memory_snapshot.pickle   (CUDA only)
Step N is a multiple of profile_freq; the steps just before it warm the profiler up, so the
traced step shows steady-state work, not the profiler's own start-up.
"""

import contextlib
import os
import warnings

import torch

# Each traced step is its own profiler cycle by design; torch warns that cycles do not accumulate.
warnings.filterwarnings("ignore", message="Profiler clears events at the end of each cycle")

_WARMUP = 3  # steps recorded and discarded before each traced step (fewer when profile_freq is small)
_SNAPSHOT_ENTRIES = 100_000  # allocator events kept for the memory snapshot


class Profiler:
    """Use as a context manager around the training loop; call step(n) after step n."""

    def __init__(self, cfg, dump_folder: str, rank: int, device: torch.device, start_step: int, last_step: int, log):
        self.cfg, self.rank, self.device, self.log = cfg, rank, device, log
        self.trace_dir = os.path.join(dump_folder, cfg.save_traces_folder)
        self.snapshot_dir = os.path.join(dump_folder, cfg.save_memory_snapshot_folder)
        self.start_step, self.last_step = start_step, last_step
        self.prof = None
        self.snapshots = cfg.enable_memory_snapshot and device.type == "cuda"
        self.written: list[str] = []

    def __enter__(self):
        if self.cfg.enable_memory_snapshot and not self.snapshots:
            self.log(f"[torchtitan] profiling.enable_memory_snapshot is CUDA-only (this run is on {self.device.type}):"
                     " no memory snapshot is written")
        if self.snapshots:
            torch.cuda.memory._record_memory_history(max_entries=_SNAPSHOT_ENTRIES)
        if self.cfg.enable_profiling:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.device.type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self.prof = torch.profiler.profile(
                activities=activities,
                schedule=self._action, on_trace_ready=self._write_trace, record_shapes=True, with_stack=True,
            )
            # The profiler's step number is the training step being run (trace: "ProfilerStep#N"),
            # also after a resume; set before it starts, which acts on the first step's action.
            self.prof.step_num = self.start_step + 1
            self.prof.current_action = self._action(self.prof.step_num)
            self.prof.__enter__()
        return self

    def _action(self, step: int):
        """What the profiler does during training step `step`."""
        freq = self.cfg.profile_freq
        warmup = min(_WARMUP, freq - 1)
        if step > self.last_step:  # after training: leaving WARMUP at exit saves nothing
            return torch.profiler.ProfilerAction.WARMUP
        if step % freq == 0:
            return torch.profiler.ProfilerAction.RECORD_AND_SAVE
        if step % freq >= freq - warmup:
            return torch.profiler.ProfilerAction.WARMUP
        return torch.profiler.ProfilerAction.NONE

    def _write_trace(self, prof) -> None:
        step = prof.step_num - 1  # called from step() after the traced step, whose number it has advanced
        folder = os.path.join(self.trace_dir, f"iteration_{step}")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"rank{self.rank}_trace.json")
        prof.export_chrome_trace(path)
        self.written.append(path)
        self.log(f"[torchtitan] profiler trace of step {step} written to {path}")

    def step(self, step: int) -> None:
        """Step `step` has finished."""
        if self.prof is not None:
            self.prof.step()
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
