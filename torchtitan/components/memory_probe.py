"""Bytes held for backward: what forward leaves alive for backward to use.

A TorchDispatchMode active during one micro-batch's forward (and loss) records a weak
reference to the storage of every tensor an op creates, parameter all-gather buffers
included. Right before backward, the storages still alive are what autograd saved, what
selective checkpointing cached, and gathered parameters kept for backward; their current
sizes (a freed FSDP2 buffer has size 0) are summed, each storage once. Ops that compiled
graphs run inside their own kernels are not seen: measure in eager mode.
"""

import weakref

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class HeldForBackward(TorchDispatchMode):
    supports_higher_order_operators = True

    def __init__(self):
        super().__init__()
        self._storages: dict[int, weakref.ref] = {}

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not isinstance(func, torch._ops.HigherOrderOperator) and any(issubclass(t, DTensor) for t in types):
            return NotImplemented  # see the plain-tensor ops DTensor lowers to
        out = func(*args, **kwargs)
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and not isinstance(t, DTensor) and t.device.type != "meta":
                storage = t.untyped_storage()
                self._storages[id(storage)] = weakref.ref(storage)
        return out

    def held_bytes(self) -> int:
        seen, total = set(), 0
        for ref in self._storages.values():
            storage = ref()
            if storage is None:
                continue
            try:
                ptr, nbytes = storage.data_ptr(), storage.nbytes()
            except RuntimeError:  # a storage without data (e.g. a wrapper's placeholder)
                continue
            if ptr not in seen:
                seen.add(ptr)
                total += nbytes
        return total
