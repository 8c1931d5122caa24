"""The CPU profile's timing statistic and its calibration row (local_profile.py): every
figure is the median of its repeats, the statistic a job's step is read with; the debug
Llama3's step, on which the thread speedup, the sharing of the cores, the rate of the
memory-bound ops inside a step and the profile's one fitted constant (time_factor) are read."""

from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
import time

import torch

from torchtitan.hardware import HardwareProfile

# repeats of the measurements that vary most between runs on a shared machine (thread
# speedup, sharing, gloo): three read gloo's 2-rank rate at 0.96 and 2.6 GB/s in two profiles
REPEATS = 5


def timed(fn, repeat: int = 5) -> float:
    """The median of `repeat` timed calls after one warm-up: the statistic a training job's
    step time is read with (scripts/step_time_check.py), so that predicted and measured seconds
    are the same kind of number (the best of N reads a CPU faster than any step runs)."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def calibration_step():
    """The calibration row's step as a function: the framework's debug Llama3 (flavor
    debugmodel, local batch 4, seq 256) forward, loss and backward, weights initialised. The
    thread speedup, the sharing and the fitted time_factor are all read on it: the ops of a
    real step, where micro-benchmarks read single ops a few percent fast."""
    from torchtitan.config.manager import build_config
    from torchtitan.training.planned_job import model_on_meta

    cfg, _ = build_config(
        ["--model.name=llama3", "--model.flavor=debugmodel", "--training.seq_len=256"]
    )
    model = model_on_meta(cfg).model
    model.to_empty(device="cpu")
    model.init_weights(0, torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 2000, (4, 256), generator=gen)
    labels = torch.randint(0, 2000, (4, 256), generator=gen)

    def step():
        logits = model(tokens).float()
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten()).backward()

    return step


def _on_threads(step, threads: int) -> float:
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return timed(step, 1)
    finally:
        torch.set_num_threads(previous)


def thread_speedup(cores: int) -> float:
    """A rank with every core's thread over one thread on the calibration row: the median of
    REPEATS ratios, each of a pair measured back to back (a pair shares the machine's state
    of the moment; one pair of a small block read 1.73 in one round of the CPU check and 1.82
    in the next)."""
    if cores <= 1:
        return 1.0
    step = calibration_step()
    return statistics.median(
        _on_threads(step, 1) / _on_threads(step, cores) for _ in range(REPEATS)
    )


def _concurrent_worker(rank: int, out_path: str) -> None:
    torch.set_num_threads(1)
    t = timed(calibration_step(), REPEATS)
    with open(f"{out_path}.{rank}", "w") as f:
        f.write(str(t))


def measure_sharing(cores: int) -> dict[str, float]:
    """{ranks: slowdown}: the calibration row's step when `ranks` single-threaded processes run
    it at once, over the same step alone (shared caches, memory bandwidth, time slices beyond
    the cores), for 2 and 4 processes."""
    import torch.multiprocessing as mp

    torch.set_num_threads(1)
    alone = timed(calibration_step(), REPEATS)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in (2, 4):
            path = os.path.join(tmp, f"conc{n}")
            mp.spawn(_concurrent_worker, args=(path,), nprocs=n, join=True)
            times = [float(open(f"{path}.{r}").read()) for r in range(n)]
            out[str(n)] = statistics.median(times) / alone
    return out


class _Traced:
    """Runs a step with every op traced on `profile` (step_time's OpTrace, as the forward
    phase) and, when `time_memory`, each memory-bound op timed where it runs: `moved` bytes
    in `seconds` (less the profile's host time per op)."""

    def __init__(self, profile: HardwareProfile, time_memory: bool = False):
        from torchtitan.planning.step_time.trace import OpTrace

        self.trace = OpTrace(profile, compiled=False)
        self.time_memory, self.host_s = time_memory, profile.host_us_per_op * 1e-6
        self.moved, self.seconds = 0, 0.0

    def run(self, step) -> _Traced:
        from torch.utils._python_dispatch import TorchDispatchMode

        traced = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                t0 = time.perf_counter()
                out = func(*args, **kwargs)
                elapsed = time.perf_counter() - t0
                trace = traced.trace
                trace.seen(func, args, kwargs, out, label="forward", action=None)
                if traced.time_memory and trace.last_kind == "memory":
                    traced.moved += trace.last_bytes
                    traced.seconds += max(elapsed - traced.host_s, 0.0)
                return out

        with Mode(), self.trace.recording():
            step()
        return self


def step_memory_rate(profile: HardwareProfile) -> float:
    """GB/s the memory-bound ops of the calibration step reach on one thread: each op the
    step-time trace classes as `memory` timed where it runs, its bytes (read and written, as
    the trace counts them) over its seconds less the profile's host time per op; the median
    over REPEATS steps. Measured, not fitted: the micro-benchmark's rate reads warm caches and
    reused outputs, a step's ops read activations written long before into fresh outputs
    (2-3x slower here, and the share of such ops differs by model family)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        step = calibration_step()
        step()  # warm-up: first-call allocations, lazy initialisation
        rates = []
        for _ in range(REPEATS):
            traced = _Traced(profile, time_memory=True).run(step)
            rates.append(traced.moved / max(traced.seconds, 1e-9) / 1e9)
    finally:
        torch.set_num_threads(previous)
    return statistics.median(rates)


def calibration_seconds(profile: HardwareProfile) -> tuple[float, float]:
    """(measured, predicted) seconds of the calibration row (calibration_step) on one thread,
    alone; predicted by the step-time trace on `profile` (device + host: a CPU runs both on
    the thread)."""
    from torchtitan.planning.step_time.trace import Compute

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        step = calibration_step()
        measured = timed(step, REPEATS)
        trace = _Traced(dataclasses.replace(profile, time_factor=1.0)).run(step).trace
    finally:
        torch.set_num_threads(previous)
    predicted = sum(
        e.device_s + e.recompute_s + e.host_s
        for seg in trace.segments
        for e in seg.events
        if isinstance(e, Compute)
    )
    return measured, predicted
