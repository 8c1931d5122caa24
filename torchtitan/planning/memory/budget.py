"""The memory budget of one rank, torch-free: `[planning] memory_budget_gib`, or its default.

- > 0: that many GiB.
- "none": no budget (None).
- "auto" (the default), by the device the job trains on (training.device; auto = CUDA when
  `nvidia-smi` lists GPUs):
  - CUDA: the device's total memory (`nvidia-smi --query-gpu=memory.total`, the smallest of
    the visible GPUs) minus a 10% margin; None (unknown) when nvidia-smi cannot say, and the
    workers check later with torch;
  - CPU: MemAvailable (/proc/meminfo) divided by the ranks on this node, minus what a rank
    costs beyond its tensors (CPU_RANK_OVERHEAD_BYTES).

Ranks on this node: LOCAL_WORLD_SIZE, which torchrun sets in every worker and run_train.sh
sets (to NGPU) for its config check; without it, all ranks are taken to share this node.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torchtitan.hardware import gpu_memory_bytes
from torchtitan.units import GIB, MIB

if TYPE_CHECKING:
    from torchtitan.config.job_config import JobConfig

CUDA_MARGIN = 0.10  # of the device memory: CUDA context, allocator fragmentation, NCCL buffers

# What one CPU trainer rank holds in resident memory beyond its tensors, measured with torch
# 2.13 on this project's CPU machine (2 cores): NGPU=2 llama3_debug.toml (debugmodel, FSDP over
# 2 gloo ranks, 4 x 256 tokens per rank), VmRSS / VmHWM of each worker from /proc/<pid>/status
# against its tensor bytes (live CPU tensors counted through the gc, and the step's peak of
# allocated bytes from the torch profiler's memory events):
#   after `import torch, torchtitan.train` + gloo init + one all-reduce: 305 MiB (no tensors);
#   before the first step: VmRSS 437 MiB, tensors 11 MiB -> 426 MiB (+ model, data, tokenizer);
#   after 2 steps: VmHWM 708 MiB at a tensor peak of 216 MiB -> 492 MiB (+ autograd threads'
#   arenas, gloo buffers, the allocator's retained pages).
# Rounded up to 512 MiB per rank.
CPU_RANK_OVERHEAD_BYTES = 512 * MIB


@dataclass(frozen=True)
class Budget:
    """Bytes of tensor memory one rank may use, and where the number comes from (for messages)."""

    bytes: int
    origin: str  # e.g. "CPU: 20.9 GiB available / 2 ranks - 0.5 GiB per process"


def ranks_on_this_node(world_size: int) -> int:
    """LOCAL_WORLD_SIZE (torchrun in a worker, run_train.sh in its check), else the world size."""
    value = os.environ.get("LOCAL_WORLD_SIZE", "")
    return int(value) if value.isdigit() and int(value) > 0 else world_size


def mem_available_bytes(meminfo: str = "/proc/meminfo") -> int | None:
    """MemAvailable of this machine, None where the file does not say (not Linux)."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def resident_bytes() -> int:
    """VmRSS of this process (0 where /proc does not say)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def memory_budget(
    cfg: JobConfig,
    ranks_per_node: int,
    *,
    meminfo: str = "/proc/meminfo",
    started_rank: bool = False,
) -> Budget | None:
    """The budget (module docstring); None = no budget or unknown. `started_rank`: this process
    is one of the ranks, so the ranks' own overhead is partly resident already: only what
    exceeds this process's VmRSS is still to come."""
    value = cfg.planning.memory_budget_gib
    if value == "none":
        return None
    if value != "auto":
        return Budget(int(value * GIB), "--planning.memory_budget_gib")
    device = cfg.training.device
    gpus = gpu_memory_bytes() if device != "cpu" else None
    if device == "cuda" or gpus:
        if not gpus:
            return None
        total = min(gpus)
        return Budget(
            int(total * (1 - CUDA_MARGIN)),
            f"CUDA: {total / GIB:,.1f} GiB device memory - {CUDA_MARGIN:.0%} margin",
        )
    available = mem_available_bytes(meminfo)
    if available is None:
        return None
    overhead = max(0, CPU_RANK_OVERHEAD_BYTES - (resident_bytes() if started_rank else 0))
    per_rank = available // ranks_per_node - overhead
    return Budget(
        max(per_rank, 0),
        f"CPU: {available / GIB:,.1f} GiB available / {ranks_per_node}"
        f" rank{'s' if ranks_per_node > 1 else ''} - {overhead / GIB:.1f} GiB per process",
    )
