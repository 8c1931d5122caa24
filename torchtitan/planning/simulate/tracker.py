"""Live tensor bytes over one simulated training step, their peak, and what it holds.

`LiveBytes` is a dispatch mode (observe/plain_tensor_ops.py) that sees every op below autograd and DTensor (plain
tensors, fake or real): each storage an op creates is counted once, with its size, until
the storage dies (a weak reference's callback: CPython frees at the last reference, and
torch keeps one Python object per storage). Storage resizes (FSDP2 frees and re-allocates
its unsharded parameters with `storage.resize_`) move the count too. Storages alive before
tracking starts come from a census (`adopt`).

Every change is logged, so the breakdown at the peak is rebuilt afterwards with each
storage's final category (a storage made in backward that ends up as a parameter's `.grad`
is relabelled a gradient after the fact, yet counted as one at the peak).

It does not see memory a kernel allocates and frees inside itself, except what `workspaces`
names (our own composite ops, e.g. SimpleFSDP's gather: its flat gathered buffer), nor
memory outside torch's allocator (e.g. gloo's own buffers).
"""

from __future__ import annotations

import contextlib
import weakref
from collections import Counter
from collections.abc import Callable

import torch
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._sharding_prop import ShardingPropagator
from torch.utils._pytree import tree_leaves

from torchtitan.observe.plain_tensor_ops import PlainTensorOps
from torchtitan.training.phases import TAIL, StepPhase, phase_of


class LiveBytes(PlainTensorOps):
    def __init__(
        self, categorize: Callable[..., str], fake_mode=None, workspaces: dict | None = None
    ):
        super().__init__()
        # op -> f(outputs) = bytes the op's kernel holds besides its outputs at its peak
        self.workspaces = workspaces or {}
        self.fake_mode = fake_mode  # count fake tensors of this mode only (None: real tensors only)
        self.categorize = categorize  # (op or None, phase, args) -> category
        self.phase: str = StepPhase.SETUP  # the running phase's label (training/phases.py)
        self.action = (
            None  # the pipeline action running: (stage, "F" | "B" | "I" | "W", microbatch)
        )
        self.observer = (
            None  # also told every op with the phase (planning/step_time/trace.py's OpTrace)
        )
        self.live = 0
        self.peak = 0
        self.peak_phase = ""
        # the peaks before the step tail and in it, apart: the block extrapolation
        # (planning/simulate/roles.py) follows each, as one may overtake the other with blocks
        self.points: dict[str, list] = {"body": [0, "", 0], "tail": [0, "", 0]}
        self._serial: dict[int, int] = {}  # id(storage) -> serial of the live storage
        self._size: dict[int, int] = {}  # serial -> bytes now
        self._category: dict[int, str] = {}  # serial -> category (kept after death)
        self._origin: dict[int, str] = {}  # serial -> "op @ phase" that made it
        self._refs: dict[int, weakref.ref] = {}
        self._log: list[tuple[int, int]] = []  # (serial, delta bytes)
        self._peak_event = 0
        self._resize = self._propagate = None
        self._paused = 0

    def _add(self, storage, category: str, origin: str = "") -> None:
        key = id(storage)
        if key in self._serial:
            return
        serial = len(self._category)
        self._serial[key] = serial
        self._category[serial] = category
        self._origin[serial] = origin
        self._size[serial] = 0
        self._refs[serial] = weakref.ref(storage, lambda _r, k=key, s=serial: self._drop(k, s))
        self._moved(serial, storage.nbytes())

    def _drop(self, key: int, serial: int) -> None:
        if self._serial.get(key) == serial:
            del self._serial[key]
        self._refs.pop(serial, None)
        self._moved(serial, -self._size[serial])

    def _moved(self, serial: int, delta: int) -> None:
        if not delta:
            return
        self._size[serial] += delta
        self._log.append((serial, delta))
        self.live += delta
        if delta > 0 and self.live > self.peak:
            self.peak = self.live
            self.peak_phase = self.phase
            self._peak_event = len(self._log)
        if delta > 0:
            point = self.points["tail" if _in_tail(self.phase) else "body"]
            if self.live > point[0]:
                point[:] = [self.live, self.phase, len(self._log)]

    def adopt(self, tensors, category: str) -> None:
        """Count storages alive before tracking (parameters, optimizer states, ...)."""
        for t in tensors:
            if isinstance(t, DTensor):
                t = t._local_tensor
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self._add(t.untyped_storage(), category)

    def bump(self, nbytes: int, category: str) -> None:
        """A transient the dispatcher does not see (inside a kernel), at this moment only."""
        if nbytes <= 0:
            return
        serial = len(self._category)
        self._category[serial] = category
        self._origin[serial] = f"workspace @ {self.phase}"
        self._size[serial] = 0
        self._moved(serial, nbytes)
        self._moved(serial, -nbytes)

    def relabel(self, tensors, category: str) -> None:
        for t in tensors:
            if isinstance(t, DTensor):
                t = t._local_tensor
            if isinstance(t, torch.Tensor) and id(t.untyped_storage()) in self._serial:
                self._category[self._serial[id(t.untyped_storage())]] = category

    def breakdown_at_peak(self, event: int | None = None) -> dict[str, int]:
        """Live bytes per category at the peak (or after log entry `event`)."""
        out: Counter = Counter()
        for serial, delta in self._log[: self._peak_event if event is None else event]:
            out[self._category[serial]] += delta
        return {k: v for k, v in out.items() if v}

    @contextlib.contextmanager
    def paused(self):
        """Storages created inside are not counted (not memory of the simulated job)."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def __enter__(self):
        tracker = self
        original = torch.UntypedStorage.resize_

        def resize_(storage, size):
            serial = tracker._serial.get(id(storage))
            out = original(storage, size)
            if serial is None:
                tracker._add(storage, tracker.categorize(None, tracker.phase, ()))
            else:
                tracker._moved(serial, size - tracker._size[serial])
            return out

        # DTensor's sharding propagation builds example tensors (kept in its cache): not memory
        propagate = ShardingPropagator._propagate_tensor_meta_non_cached

        def propagate_untracked(*args, **kwargs):
            with tracker.paused():
                return propagate(*args, **kwargs)

        self._resize, self._propagate = original, propagate
        torch.UntypedStorage.resize_ = resize_
        ShardingPropagator._propagate_tensor_meta_non_cached = propagate_untracked
        return super().__enter__()

    def __exit__(self, *exc):
        torch.UntypedStorage.resize_ = self._resize
        ShardingPropagator._propagate_tensor_meta_non_cached = self._propagate
        return super().__exit__(*exc)

    def deferred(self, func) -> None:
        if self.observer is not None and not self._paused:
            self.observer.dtensor_op(self.phase, self.action)

    def seen(self, func, args, out, kwargs=None) -> None:
        if self._paused:
            return
        if self.observer is not None:
            self.observer.seen(func, args, kwargs or {}, out, label=self.phase, action=self.action)
        category = None
        for t in tree_leaves(out):
            # DTensor's sharding propagation makes fake tensors of its own: not memory
            if (
                isinstance(t, torch.Tensor)
                and not isinstance(t, DTensor)
                and t.device.type != "meta"
                and (getattr(t, "fake_mode", None) is self.fake_mode)
            ):
                storage = t.untyped_storage()
                if id(storage) not in self._serial:
                    category = category or self.categorize(func, self.phase, args)
                    self._add(storage, category, f"{func} @ {self.phase}")
        if func in self.workspaces:
            self.bump(
                self.workspaces[func](out), category or self.categorize(func, self.phase, args)
            )


def _in_tail(phase) -> bool:
    try:
        return phase_of(str(phase)) in TAIL
    except ValueError:  # no phase yet
        return False
