"""Collective counts and bytes per step, by phase, collective and mesh dimension.

A TorchDispatchMode sees every collective op this process issues: FSDP2's c10d calls,
DTensor's functional collectives (TP), the pipeline's send/recv, and the functional
collectives that compiled graphs call at run time (`ignore_compile_internals` keeps the
mode out of compilation but active while compiled code runs). Ops on tensor subclasses
(DTensor, torchao's float8 tensors) are handed back to the subclass first, so the mode sees
the collectives they lower to (a float8 gather: 1 byte per element) instead of the
subclass's op.

Keys are "<phase>/<collective>/<mesh dim>": phase is backward while autograd runs backward
(or inside `phase("backward")`, e.g. the pipeline's deferred gradient reduction), else the
phase the trainer set (forward around forward/backward work, other around the rest).
Bytes are the unsharded volume: all_gather output, reduce_scatter input, the tensor of
all_reduce / broadcast / send / recv / all_to_all.
"""

import contextlib
from collections import Counter
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

_KINDS = {
    # torch.ops.c10d (eager process-group calls: FSDP2, pipelining, dist.*)
    "_allgather_base_": "all_gather",
    "allgather_": "all_gather",
    "allgather_coalesced_": "all_gather",
    "allgather_into_tensor_coalesced_": "all_gather",
    "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "allreduce_": "all_reduce",
    "allreduce_coalesced_": "all_reduce",
    "alltoall_": "all_to_all",
    "alltoall_base_": "all_to_all",
    "broadcast_": "broadcast",
    "send": "send",
    "recv_": "recv",
    "recv_any_source_": "recv",
    # torch.ops._c10d_functional (DTensor, SimpleFSDP, compiled graphs)
    "all_gather_into_tensor": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "all_gather_into_tensor_out": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "all_reduce": "all_reduce",
    "all_reduce_": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "all_reduce_coalesced_": "all_reduce",
    "all_to_all_single": "all_to_all",
    "broadcast": "broadcast",
    # SimpleFSDP's unit gather (cast + all-gather + copy-out in one op; its inner collective
    # runs below this mode)
    "simple_fsdp_gather": "all_gather",
}
_NAMESPACES = ("c10d", "_c10d_functional", "_c10d_functional_autograd", "torchtitan")


def _tensor_bytes(x) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_tensor_bytes(t) for t in x)
    return 0


def _wrapper(t: type) -> bool:
    """A traceable tensor subclass that wraps other tensors (torchao's Float8TrainingTensor,
    funcol's AsyncCollectiveTensor): it lowers an op to ops on what it wraps."""
    return t is not torch.Tensor and hasattr(t, "__tensor_flatten__")


def group_name_of(args, known: dict) -> str | None:
    """The process group a collective op's arguments name: a boxed ProcessGroup's name, or
    the string argument that is a known group's name (functional collectives pass it last)."""
    strings = []
    for a in args:
        if isinstance(a, str):
            strings.append(a)  # functional ops: (..., "sum", group_size, group_name)
        elif isinstance(a, torch.ScriptObject) and "ProcessGroup" in a._type().qualified_name():
            return dist.ProcessGroup.unbox(a).group_name
    return next((x for x in strings if x in known), strings[-1] if strings else None)


def collective_bytes(kind: str, func, args) -> int:
    """The unsharded bytes a collective moves (module docstring)."""
    namespace = func._overloadpacket._qualified_op_name.split("::")[0]
    if namespace == "c10d":
        # c10d ops take (outputs, inputs, ...) or (tensors, ...): the larger side.
        return max(_tensor_bytes(args[0]), _tensor_bytes(args[1]) if len(args) > 1 else 0)
    if namespace == "torchtitan":  # (shards, group_size, group_name, dtype, ...): gathered in dtype
        return sum(t.numel() for t in args[0]) * int(args[1]) * args[3].itemsize
    if kind == "all_gather":
        return _tensor_bytes(args[0]) * int(args[1])  # (input, group_size, group_name)
    return _tensor_bytes(args[0])


def collective_kind(func, args) -> str | None:
    """all_gather / reduce_scatter / all_reduce / all_to_all / broadcast / send / recv for a
    collective op, None for any other op. Shared with the step-time trace (memory/op_trace.py)."""
    namespace, name = func._overloadpacket._qualified_op_name.split("::")
    kind = _KINDS.get(name) if namespace in _NAMESPACES else None
    if kind is None or (namespace == "torchtitan" and not args[2]):  # group "": nothing gathered
        return None
    return kind


class CommStats(TorchDispatchMode):
    def __init__(self, group_dims: dict[str, str]):
        """group_dims: process-group name -> mesh dimension name (pp, dp_shard, tp, ...)."""
        super().__init__()
        self.group_dims = group_dims
        self.phase_name = "other"
        self.forced: list[str] = []
        self.counts: Counter = Counter()
        self.bytes: Counter = Counter()

    # Higher-order ops (e.g. the RNG wrappers of checkpointing under compile) come through
    # __torch_dispatch__, which runs them unchanged.
    supports_higher_order_operators = True

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Attribute collectives inside to `name` (backward detection still applies)."""
        self.forced.append(name)
        try:
            yield
        finally:
            self.forced.pop()

    def reset(self) -> tuple[dict, dict]:
        """Return (counts, bytes) since the last reset and start counting anew."""
        out = dict(sorted(self.counts.items())), dict(sorted(self.bytes.items()))
        self.counts, self.bytes = Counter(), Counter()
        return out

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **kwargs)
        if any(issubclass(t, DTensor) or _wrapper(t) for t in types):
            # let DTensor (or torchao's float8 tensor, whose element size is the original
            # dtype's) lower the op: its collectives come back here on the bytes they move
            return NotImplemented
        out = func(*args, **kwargs)
        kind = collective_kind(func, args)
        if kind is not None:
            self._record(kind, func, args)
        return out

    def _record(self, kind: str, func, args) -> None:
        name = group_name_of(args, self.group_dims)
        dim = self.group_dims.get(name, "world" if name is None else f"group:{name}")
        if torch._C._current_graph_task_id() != -1:
            phase = "backward"
        else:
            phase = self.forced[-1] if self.forced else self.phase_name
        nbytes = collective_bytes(kind, func, args)
        key = f"{phase}/{kind}/{dim}"
        self.counts[key] += 1
        self.bytes[key] += nbytes
