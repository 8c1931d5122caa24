"""Bytes held for backward: what forward leaves alive for backward to use.

A TorchDispatchMode active during one micro-batch's forward (and loss) records a weak
reference to the storage of every tensor an op returns, parameter all-gather buffers
included. Right before backward, the storages still alive are what autograd saved, what
selective checkpointing cached, and gathered parameters kept for backward; their current
sizes (a freed FSDP2 buffer has size 0) are summed, each storage once. Ops that compiled
graphs run inside their own kernels are not seen: measure in eager mode.

An op's output may be a view of a tensor that existed before the forward: SimpleFSDP reads
its DTensor parameters' local shards through `to_local()`, a view. The storages of the
`persistent` tensors (the model's parameters and buffers) that hold data when the forward
starts and still hold the same data before backward live on after the step whatever
backward needs, so they are not counted. A persistent storage that gets its data during the
forward (FSDP2's unsharded parameters, resized from 0 bytes) is counted.
"""

import weakref
from collections.abc import Iterable

import torch
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_leaves

from torchtitan.observe.plain_tensor_ops import PlainTensorOps


def _local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if isinstance(t, DTensor) else t


class HeldForBackward(PlainTensorOps):
    def __init__(self, persistent: Iterable[torch.Tensor] = ()):
        super().__init__()
        self._storages: dict[int, weakref.ref] = {}
        self._persistent = [_local(t) for t in persistent]
        self._before: list[
            tuple[torch.Tensor, int]
        ] = []  # (persistent tensor, its data address at entry)

    def __enter__(self):
        self._before = [
            (t, t.untyped_storage().data_ptr())
            for t in self._persistent
            if t.device.type != "meta" and t.untyped_storage().nbytes() > 0
        ]
        return super().__enter__()

    def seen(self, func, args, out, kwargs=None) -> None:
        for t in tree_leaves(out):
            if (
                isinstance(t, torch.Tensor)
                and not isinstance(t, DTensor)
                and t.device.type != "meta"
            ):
                storage = t.untyped_storage()
                self._storages[id(storage)] = weakref.ref(storage)

    def held_bytes(self) -> int:
        # persistent storages unchanged since entry (same data address): alive anyway
        seen = {ptr for t, ptr in self._before if t.untyped_storage().data_ptr() == ptr}
        total = 0
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
