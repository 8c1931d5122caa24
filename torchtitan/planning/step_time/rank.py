"""The timing of one simulated rank: the simulation (planning/simulate/step.py) is handed a
`RankTimer`, whose trace sees every op of the step, and which times the trace on a hardware
profile once the step ends (the process groups its collectives ran on, the cores a CPU
node's ranks share, the pipeline schedule's order)."""

from __future__ import annotations

from dataclasses import dataclass

from torchtitan.distributed.job_shape import replica_groups
from torchtitan.hardware import HardwareProfile
from torchtitan.planning.step_time import cpu_sharing
from torchtitan.planning.step_time import model as step_time
from torchtitan.planning.step_time import pipeline as pipeline_time
from torchtitan.planning.step_time.trace import REPLICA_GROUPS, OpTrace


@dataclass(frozen=True)
class RankTimer:
    """Times the simulated step of one rank on `hardware`."""

    hardware: HardwareProfile

    def observer(self, cfg) -> OpTrace:
        return OpTrace(self.hardware, cfg.compile.enable)

    def times(
        self, trace: OpTrace, dims, cfg, pipeline
    ) -> tuple[step_time.RankTimes, tuple | None]:
        """The rank's per-phase times, and its pipeline schedule's order (None without PP)."""
        simple_fsdp_eager = (
            cfg.parallelism.fsdp_implementation == "simple_fsdp" and not cfg.compile.enable
        )
        times = step_time.rank_times(
            trace.segments,
            self.hardware,
            _groups(dims, trace, replica_groups(cfg)),
            _stretch(self.hardware, dims),
            simple_fsdp_eager,
        )
        return times, pipeline_time.schedule_order(pipeline) if pipeline is not None else None


def _groups(dims, trace: OpTrace, groups: int = 1) -> step_time.Groups:
    """The process groups the traced collectives ran on: mesh dim and global ranks; with
    `groups` fault-tolerance replica groups, theirs: one rank of each, every group a job of
    dims.world_size ranks of its own (each its own nodes when a group fills one)."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _resolve_process_group

    named = dims.named_groups()
    ranks = {}
    for seg in trace.segments:
        for e in seg.events:
            name = getattr(e, "group", None)
            if name is not None and name not in ranks:
                try:
                    ranks[name] = dist.get_process_group_ranks(_resolve_process_group(name))
                except (RuntimeError, ValueError, KeyError):
                    ranks[name] = [0]
    if groups > 1:
        ranks[REPLICA_GROUPS] = [g * dims.world_size for g in range(groups)]
        named = {**named, REPLICA_GROUPS: "ft"}
    fsdp = frozenset(dims.fsdp_group_names())
    dp = frozenset(n for n, d in named.items() if d.startswith("dp")) | fsdp
    return step_time.Groups({n: named.get(n, f"group:{n}") for n in ranks} | named, ranks, fsdp, dp)


def _stretch(hardware: HardwareProfile, dims) -> float:
    """A CPU node's ranks share its cores (cpu_sharing.cpu_stretch); 1 on a GPU."""
    return cpu_sharing.cpu_stretch(hardware, dims.world_size)
