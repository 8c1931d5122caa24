"""How the ranks of one CPU machine share its cores and wait for each other (the `local`
profile's measured terms, read by the step-time model, model.py, and the pipeline's event
simulation, pipeline.py): the stretch of each rank's compute when several run at once, a
pipeline's speed while some of its ranks wait, and the drift a blocking collective waits
for. Every function is 1 / () / 0 on a GPU profile."""

from __future__ import annotations

from torchtitan.hardware import HardwareProfile


def cpu_stretch(p: HardwareProfile, world: int) -> float:
    """A CPU node's ranks share its cores (model.py's assumption 1): device time x ranks / cores; with
    fewer ranks than cores each runs cores / ranks threads (run_train.sh), at the measured
    thread speedup (linear between one thread and all). 1 on a GPU."""
    if p.host_async or not p.cores:
        return 1.0
    cores = p.cores
    if world > 1 and p.sharing:  # measured: processes computing at once on this machine
        return _processes_stretch(p, world)
    if world >= cores or cores == 1:
        return world / cores
    threads = cores / world
    return 1.0 / (1.0 + (p.thread_speedup - 1.0) * (threads - 1) / (cores - 1))


def _processes_stretch(p: HardwareProfile, n: int) -> float:
    """The slowdown of each of n one-thread processes computing at once (the measured sharing
    of the nearest count at or below n; beyond the largest measured count: time slices)."""
    if n <= 1:
        return 1.0
    measured = {int(k): v for k, v in p.sharing.items()}
    below = [k for k in measured if k <= n]
    k = max(below) if below else min(measured)
    return measured[k] * n / k


def sync_skew(p: HardwareProfile, world: int) -> float:
    """A measured CPU profile's wait per second of computation before a blocking collective
    (cpu_workers._sync_skew; the gloo table of 2 or 4 processes, as collective_seconds) where
    the ranks have a core each; 0 with more ranks than cores (the time slices' wait is in the
    collectives' fixed costs) and on a GPU (its ranks run their kernels without time slices)."""
    if not p.gloo or world <= 1 or world > p.cores:
        return 0.0
    return p.gloo["4" if world > 2 and "4" in p.gloo else "2"].get("skew", 0.0)


def busy_rates(p: HardwareProfile, world: int, pp: int) -> tuple[float, ...]:
    """A CPU pipeline's speed by how many of its ranks compute at once: entry k (1..pp) is how
    much faster an action runs while k pipeline ranks (and as many of every other pipeline:
    the replicas run the same schedule) compute than while all do, which is how its time was
    taken (cpu_stretch of the world). A rank waiting for its neighbour's activations leaves
    its core to the others: 4 ranks on 2 cores run at half speed each while all compute and at
    full speed while half of them wait. () on a GPU, or where the ranks run several threads."""
    if p.host_async or not p.cores or not p.sharing or world < p.cores or pp <= 1:
        return ()
    replicas = max(1, world // pp)
    full = cpu_stretch(p, world)
    return (1.0,) + tuple(full / _processes_stretch(p, k * replicas) for k in range(1, pp + 1))
