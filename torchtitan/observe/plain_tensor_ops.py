"""A dispatch mode that sees every op on plain tensors, the base of the meters that count
storages (observe/held_for_backward.py, memory/tracker.py).

An op on a DTensor is handed back to DTensor first, so the plain-tensor ops it lowers to
(local shards, collectives) come back here; compiled code's ops are seen when it runs
(`ignore_compile_internals` keeps the mode out of compilation itself)."""

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode


class PlainTensorOps(TorchDispatchMode):
    supports_higher_order_operators = True

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def deferred(self, func) -> None:
        """Called for each op on DTensors, before DTensor lowers it to plain-tensor ops."""

    def seen(self, func, args, out, kwargs=None) -> None:
        """Called after each op on plain tensors with its arguments, output and keyword arguments."""
        raise NotImplementedError

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not isinstance(func, torch._ops.HigherOrderOperator) and any(
            issubclass(t, DTensor) for t in types
        ):
            self.deferred(func)
            return NotImplemented  # see the plain-tensor ops DTensor lowers to
        out = func(*args, **kwargs)
        self.seen(func, args, out, kwargs)
        return out
