"""Train and record, per rank and step, every read of a tensor's value by the host.

    torchrun --nproc_per_node=N tests/integration/host_reads.py OUT.json [config overrides]

On a GPU each such read waits for the device to finish all the work queued before it (a
host sync). Two modes see them all: a TorchDispatchMode sees `.item()`, `float()`, `int()`
and `bool()` (each reaches the `_local_scalar_dense` op), and a TorchFunctionMode sees the
calls that copy to the host without that op (`.tolist()`, `.cpu()`, `.numpy()`, `.to("cpu")`).
A read is attributed to the step the trainer reports it is in (its hang watchdog's activity,
"step N: ..."). Left out, as reads of host tensors on every device: the data phase (its
batches are built on the host), torch.optim's reads of its step counters (CPU tensors), and
the preemption agreement's read of its flag (on a GPU a pinned host copy, queued with the
all-reduce one step boundary earlier: resilience/preemption.py). OUT.json (written by
rank 0): {"reads": {rank: {step: {what: count}}}, "log_freq": n}.
"""

import json
import os
import re
import sys
import traceback
from collections import Counter, defaultdict

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from torchtitan.checks import load_config_or_exit
from torchtitan.train import Trainer

_STEP = re.compile(r"step (\d+)")
_HOST_TENSOR_READERS = ("torchtitan/resilience/preemption.py:",)
_COPY_METHODS = {
    torch.Tensor.tolist: "tolist",
    torch.Tensor.cpu: "cpu",
    torch.Tensor.numpy: "numpy",
}


def _to_host(args, kwargs) -> bool:
    """Whether a Tensor.to(...) call names the CPU as a string ("cpu"): a host copy on every
    device. A torch.device target is the run's device in this code (torch's own included),
    which on a CPU run is the CPU without being a host copy on a GPU run: not counted."""
    return any(
        isinstance(a, str) and a.split(":")[0] == "cpu" for a in (*args[1:], kwargs.get("device"))
    )


def _caller() -> str:
    """Our innermost frame on the stack (torchtitan/...:line): the line that led to the read."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if "/torchtitan/" in frame.filename:
            return f"torchtitan/{frame.filename.rsplit('/torchtitan/', 1)[1]}:{frame.lineno}"
    return "?"


class Reads:
    def __init__(self, trainer: Trainer):
        self.trainer = trainer
        self.by_step: dict[int, Counter] = defaultdict(Counter)
        self._counters: set[int] | None = None

    def optimizer_counters(self) -> set[int]:
        if self._counters is None or not self._counters:
            self._counters = {
                id(s["step"])
                for o in self.trainer.optimizers.optimizers
                for s in o.state.values()
                if "step" in s
            }
        return self._counters

    def note(self, what: str) -> None:
        activity = self.trainer.watchdog.activity
        m = _STEP.match(activity)
        if m is None or activity.endswith(": data"):
            return
        where = _caller()
        if where.startswith(_HOST_TENSOR_READERS):
            return
        self.by_step[int(m.group(1))][f"{what} {where}"] += 1


class ScalarReads(TorchDispatchMode):
    def __init__(self, reads: Reads):
        super().__init__()
        self.reads = reads

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if (
            func is torch.ops.aten._local_scalar_dense.default
            and id(args[0]) not in self.reads.optimizer_counters()
        ):
            self.reads.note("item")
        return func(*args, **(kwargs or {}))


class CopyReads(TorchFunctionMode):
    def __init__(self, reads: Reads):
        super().__init__()
        self.reads = reads

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _COPY_METHODS:
            self.reads.note(_COPY_METHODS[func])
        elif func is torch.Tensor.to and _to_host(args, kwargs):
            self.reads.note("to_cpu")
        return func(*args, **kwargs)


def main() -> None:
    out, argv = sys.argv[1], sys.argv[2:]
    cfg = load_config_or_exit(argv, int(os.environ["WORLD_SIZE"]))
    trainer = Trainer(cfg)
    reads = Reads(trainer)
    with CopyReads(reads), ScalarReads(reads):
        trainer.train()
    mine = {step: dict(c) for step, c in sorted(reads.by_step.items())}
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(
                {"reads": {r: e for r, e in enumerate(everyone)}, "log_freq": cfg.metrics.log_freq},
                f,
            )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
