"""Per-step peak of allocated tensor bytes on CPU: the analogue of torch.cuda.max_memory_allocated.

How it works. PyTorch's CPU allocator can keep a counter of the bytes it has allocated and not
yet freed (with a table of block sizes); while the torch profiler records memory, every
allocation and free on a thread that carries the profiler's state (the main thread,
autograd's, gloo's workers running a collective) is also an event holding that counter's
value right after it. The meter

1. turns the allocator's own tracking on when it is created (the c10 flag
   FLAGS_caffe2_report_cpu_memory_usage, set through ctypes; restored by close()), so the
   counter also goes down when a block is freed on a thread without the profiler's state:
   gloo's worker threads free collective buffers there. Without the flag these frees are
   missed and the counter creeps up by several MiB per step, differently in every run and
   rank (this was the "run-to-run spread" of earlier measurements);
2. before the first step, after gc.collect(), takes a census: the bytes of every CPU storage
   reachable from a Python tensor (gc.get_objects(); views share their storage and count
   once; a DTensor or other wrapper subclass counts its inner local tensors);
3. keeps the profiler on from then to the end, as consecutive windows: one per training step
   and one for what runs between two steps (data, logging, validation, checkpoints). Each
   window starts with a 1-byte probe allocation whose event reads the counter;

    peak of a step = census + (highest counter value in the step's window - counter at census)

and the bytes alive at a step's start (step_start_bytes) are census + (counter at the step's
probe - counter at census). The profiler records nothing but allocator events: its op
callbacks are limited to a RecordScope no training code uses (LITE_INTERPRETER). Kineto's
"profiler_start/stop" lines, printed for every window, are silenced by KINETO_LOG_LEVEL=6
(unless the environment sets it).

What it sees and does not see:
- gloo's own temporaries (e.g. the flat buffer of an all-gather) are allocator blocks and are
  counted, as they count in the process's memory; NCCL writes in place on GPU;
- not allocator overhead, fragmentation, or memory that is not a tensor (Python objects,
  gloo's transport buffers, the interpreter, libraries): the resident set is larger;
- not memory from outside PyTorch's CPU allocator (tensors over numpy arrays; shared-memory
  tensors of data-loader workers, which the census skips);
- a peak reached and left between two events that no profiled thread reports (an allocation
  on a thread the profiler does not know, freed before anything else happens) is not seen;
- a block allocated before the meter was created, counted by the census and freed later,
  stays counted (its free is not in the allocator's table; c10 warns "Memory block of
  unknown size..."). The trainer creates the meter first thing, before the model exists.
`live_tensor_bytes()` is the independent count: tests check the carried count against it.

Cost: about 10 us of CPU per allocator event, mostly reading the window back (the profiler's
own post-processing and the Python walk over its events; the flag and the recording add
~1-2 us per allocation + free). Debug Llama3, FSDP2, 2 ranks, local batch 2, seq 128, fp32:
~3,150 events per step, ~33 ms per step spent in the meter's calls, and +11% CPU time per
step (+15% wall time, median) against steps of the same run with the meter paused, measured
on a shared 2-core machine under load (load average 8-11).

Only one torch profiler can run in a process: the config refuses this meter together with
--profiling.enable_profiling (checks/job.py).
"""

import ctypes
import gc
import os
import warnings

import torch
from torch._C._profiler import (
    ProfilerActivity,
    ProfilerConfig,
    ProfilerState,
    RecordScope,
    _ExperimentalConfig,
    _ExtraFields_Allocation,
)
from torch.autograd import _disable_profiler, _enable_profiler, _prepare_profiler, _profiler_enabled
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

_ACTIVITIES = {ProfilerActivity.CPU}
_SCOPES = {RecordScope.LITE_INTERPRETER}  # the mobile interpreter's ops only: none in training
_CPU = torch.device("cpu")


def _config() -> ProfilerConfig:
    # (state, record_shapes, profile_memory, with_stack, with_flops, with_modules, experimental)
    return ProfilerConfig(
        ProfilerState.KINETO, False, True, False, False, False, _ExperimentalConfig()
    )


def _storages(t: torch.Tensor, out: dict[int, int]) -> None:
    """Add t's CPU storage (or its inner tensors', for a wrapper subclass) to {data_ptr: bytes}."""
    if is_traceable_wrapper_subclass(t):
        names, _ = t.__tensor_flatten__()
        for name in names:
            inner = getattr(t, name, None)
            if isinstance(inner, torch.Tensor):
                _storages(inner, out)
        return
    if t.device.type != "cpu" or t.layout != torch.strided:
        return
    try:
        storage = t.untyped_storage()
        if storage.device.type != "cpu" or storage.is_shared():
            return  # fake tensors (meta storage); shared memory is not the allocator's
        ptr, nbytes = storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError):  # a tensor without real storage
        return
    if ptr:
        out[ptr] = max(nbytes, out.get(ptr, 0))


def live_tensor_bytes() -> int:
    """Bytes of every CPU storage reachable from a Python tensor now, each storage once."""
    found: dict[int, int] = {}
    for obj in gc.get_objects():
        if issubclass(type(obj), torch.Tensor):  # not isinstance: some objects warn on __class__
            _storages(obj, found)
    return sum(found.values())


def _allocator_flag() -> ctypes.c_bool | None:
    """c10's FLAGS_caffe2_report_cpu_memory_usage (None if this build does not export it)."""
    try:
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
        return ctypes.c_bool.in_dll(lib, "FLAGS_caffe2_report_cpu_memory_usage")
    except (OSError, ValueError):
        return None


def _allocations(result) -> tuple[int, int, int | None]:
    """(counter before the window's first CPU allocator event, that event's bytes, highest
    counter after any later event or None) of a stopped profiler window. Hot: ~3000 events
    per step of the debug model; the tree's roots come in time order."""
    fields, todo = [], list(result.experimental_event_tree())
    while todo:
        batch = [e.extra_fields for e in todo]
        fields += [f for f in batch if type(f) is _ExtraFields_Allocation and f.device == _CPU]
        # Allocations inside a recorded range (no range of ours is recorded): look inside.
        todo = [
            c
            for e, f in zip(todo, batch)
            if type(f) is not _ExtraFields_Allocation
            for c in e.children
        ]
    first = fields[0]
    highest = max((f.total_allocated for f in fields[1:]), default=None)
    return first.total_allocated - first.alloc_size, first.alloc_size, highest


class CpuPeakMeter:
    """`begin_step()` right before a training step, `end_step()` right after it returns the
    step's peak allocated bytes; `close()` (or leaving the `with` block) stops the profiler."""

    def __init__(self):
        self.census_bytes: int | None = None  # live tensor bytes when the meter started
        self.step_start_bytes: int | None = None  # live tensor bytes when the last step began
        self._origin: int | None = None  # the allocator's counter at the census
        self._running = False
        self._flag = _allocator_flag()
        self._flag_before = None
        if self._flag is None:
            warnings.warn(
                "cpu_memory_peak: this torch build does not export FLAGS_caffe2_report_cpu_memory_usage;"
                " buffers freed on gloo's threads are missed and peaks creep up",
                stacklevel=2,
            )
        else:
            self._flag_before, self._flag.value = self._flag.value, True

    def _start(self) -> None:
        _prepare_profiler(_config(), _ACTIVITIES)
        _enable_profiler(_config(), _ACTIVITIES, _SCOPES)
        self._running = True
        torch.empty(
            1, dtype=torch.uint8
        )  # a probe: its event reads the counter at the window's start

    def _roll(self) -> tuple[int, int, int | None]:
        """End the current window and start the next at once; the ended window's
        _allocations()."""
        result = _disable_profiler()
        self._running = False
        self._start()
        return _allocations(result)

    def begin_step(self) -> None:
        if self._running:
            self._roll()  # what ran between steps: the counter carries it
            return
        if _profiler_enabled():
            raise RuntimeError(
                "another torch profiler is running: the CPU memory meter cannot start"
            )
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # read when kineto first starts
        gc.collect()
        self.census_bytes = live_tensor_bytes()
        self._start()

    def end_step(self) -> int:
        # The window's first event is the probe (or something earlier on another thread):
        # the counter before it is the step's start; the probe's own byte is not the step's.
        start, first_bytes, highest = self._roll()
        top = start if highest is None else max(start, highest)
        if first_bytes != 1:
            top = max(top, start + first_bytes)
        if self._origin is None:
            self._origin = start
        self.step_start_bytes = self.census_bytes + start - self._origin
        return self.census_bytes + top - self._origin

    def close(self) -> None:
        if self._running:
            _disable_profiler()
            self._running = False
        if self._flag is not None and self._flag_before is not None:
            self._flag.value, self._flag_before = self._flag_before, None

    def __enter__(self) -> "CpuPeakMeter":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False
