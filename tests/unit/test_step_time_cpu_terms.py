"""The step-time model's CPU terms measured by the local profile (local_profile.py): FSDP2's
host time charged per hook it runs (a 1-rank mesh included: its hooks run without any
collective), memory-bound ops beyond the last-level cache at DRAM's rate, and every
memory-bound op at the rate measured inside the calibration step where it was measured."""

import dataclasses

import pytest
import torch
from trace_helpers import trace_segments

from torchtitan import hardware
from torchtitan.planning.step_time.trace import Compute, op_seconds

H100 = hardware.PROFILES["h100_sxm"]


def _host_s(fn, profile) -> float:
    segments = trace_segments(fn, profile)
    return sum(e.host_s for s in segments for e in s.events if isinstance(e, Compute))


def test_each_fsdp2_hook_costs_the_profiles_host_time_on_a_one_rank_mesh(gloo_world):
    """Before: FSDP2's host time was charged per c10d collective, and a 1-rank mesh runs none:
    its hooks (15 ms a step on the debug Llama3's 8 units, measured) cost nothing."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (1,))
    units = 3
    model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(units)])
    for unit in model:
        fully_shard(unit, mesh=mesh)
    x = torch.randn(4, 16)

    def step():
        model(x).sum().backward()

    step()  # the lazy initialisation runs once, outside the measured trace
    without = _host_s(step, dataclasses.replace(H100, host_us_per_fsdp_hook=0.0))
    with_hooks = _host_s(step, dataclasses.replace(H100, host_us_per_fsdp_hook=1000.0))
    # pre/post forward, pre backward, post backward per unit
    assert with_hooks - without == pytest.approx(4 * units * 1e-3)


def test_a_cpu_op_beyond_the_last_level_cache_streams_from_dram():
    cpu = dataclasses.replace(
        H100, hbm_gbps=100.0, memory_efficiency=1.0, dram_gbps=10.0, cache_bytes=1 << 20
    )
    small, _ = op_seconds("memory", 0.0, 1 << 19, "float32", cpu, compiled=False)
    big, _ = op_seconds("memory", 0.0, 1 << 22, "float32", cpu, compiled=False)
    assert small == pytest.approx((1 << 19) / 100e9)
    assert big == pytest.approx((1 << 22) / 10e9)
    # a GPU profile has one rate (dram_gbps 0)
    gpu, _ = op_seconds("memory", 0.0, 1 << 22, "float32", H100, compiled=False)
    assert gpu == pytest.approx((1 << 22) / (H100.hbm_gbps * 1e9 * H100.memory_efficiency))


def test_a_measured_step_memory_rate_prices_every_memory_bound_op():
    """Before profile v6 a CPU's memory-bound ops ran at the micro-benchmark's in-cache rate
    (84 GB/s here): in a step they ran at 25-35 GB/s, and a model family with more of them
    (Qwen3's QK norm, the routers) was predicted too fast by more than Llama3."""
    cpu = dataclasses.replace(
        H100,
        hbm_gbps=100.0,
        memory_efficiency=1.0,
        dram_gbps=50.0,
        cache_bytes=1 << 20,
        step_memory_gbps=25.0,
    )
    for nbytes in (1 << 19, 1 << 22):  # in the cache and beyond it: one rate
        device, _ = op_seconds("memory", 0.0, nbytes, "float32", cpu, compiled=False)
        assert device == pytest.approx(nbytes / 25e9)
    # FLOP-bound ops keep their own curves
    gemm = op_seconds("gemm", 1e9, 1 << 22, "float32", cpu, compiled=False)
    assert gemm == op_seconds(
        "gemm",
        1e9,
        1 << 22,
        "float32",
        dataclasses.replace(cpu, step_memory_gbps=0.0),
        compiled=False,
    )
    assert all(p.step_memory_gbps == 0.0 for p in hardware.PROFILES.values())  # GPUs: none


def test_the_step_memory_rate_is_the_memory_bound_ops_bytes_over_their_own_seconds(monkeypatch):
    """cpu_bench.step_memory_rate times each op the trace classes `memory` where it runs: on a
    clock that moves 1 ms per reading, each op takes 1 ms, so the rate is the memory-bound
    ops' bytes over (their count x (1 ms - the host time per op)); GEMMs, attention and ops
    without a kernel are left out."""
    import itertools
    import time

    from torch.utils._python_dispatch import TorchDispatchMode

    from torchtitan.planning.step_time import cpu_bench
    from torchtitan.planning.step_time.trace import OpTrace, _nbytes

    cpu = dataclasses.replace(H100, host_async=False, host_us_per_op=200.0)
    step = cpu_bench.calibration_step()
    trace = OpTrace(cpu, compiled=False)
    counted = [0, 0]  # memory-bound ops, their bytes

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            trace.seen(func, args, kwargs or {}, out, label="forward", action=None)
            if trace.last_kind == "memory":
                counted[0] += 1
                counted[1] += _nbytes(args) + _nbytes(kwargs or {}) + _nbytes(out)
            return out

    step()
    with Count(), trace.recording():
        step()
    ticks = itertools.count()
    monkeypatch.setattr(time, "perf_counter", lambda: next(ticks) * 1e-3)
    rate = cpu_bench.step_memory_rate(cpu)
    assert counted[0] > 100
    assert rate == pytest.approx(counted[1] / (counted[0] * 0.8e-3) / 1e9, rel=1e-9)


def test_a_cpu_collective_waits_for_the_ranks_drift_over_the_computation_before_it():
    """Before profile v7 a blocking gloo collective cost its fixed time and bytes however long
    the ranks had computed since the last one; on this VM two processes drift apart by 7-12%
    of the time they compute (cpu_workers._sync_skew), and the 2-rank FSDP jobs' 23
    collectives a step paid ~45 ms more than predicted. One second of computation, two
    all-gathers: the first waits 0.1 s more, the second (nothing computed since) does not."""
    from torchtitan.planning.step_time import cpu_sharing
    from torchtitan.planning.step_time import model as step_time
    from torchtitan.planning.step_time.trace import Comm, Segment

    fixed = {k: 1000.0 for k in ("all_gather", "reduce_scatter", "all_reduce", "all_to_all")}
    table = {"gbps": 1.0, "fixed_us": fixed, "skew": 0.1}
    cpu = dataclasses.replace(
        H100,
        host_async=False,
        cores=2,
        sharing={"2": 1.0},
        gloo={"2": table},
        host_us_per_op=0.0,
        intra_latency_us=0.0,
        inter_latency_us=0.0,
    )
    groups = step_time.Groups({"dp": "dp_shard"}, {"dp": [0, 1]}, frozenset({"dp"}), frozenset())
    seg = Segment("forward", None)
    seg.events = [
        Compute(device_s=1.0),
        Comm("all_gather", "dp", 0, "c10d"),
        Comm("all_gather", "dp", 0, "c10d"),
    ]
    t = step_time.Streams(cpu, groups, 1.0, False).run([seg])
    assert t.seconds == pytest.approx(1.0 + 0.1 + 2 * 1e-3)
    assert t.parts["comm_dp_shard"] == pytest.approx(0.1 + 2 * 1e-3)
    # a GPU profile, more ranks than cores (the time slices' wait is in the fixed costs), and
    # a CPU profile without the measurement: no drift
    assert cpu_sharing.sync_skew(H100, 8) == 0.0
    assert cpu_sharing.sync_skew(dataclasses.replace(cpu, gloo={"2": table, "4": table}), 4) == 0.0
    table.pop("skew")
    assert step_time.Streams(cpu, groups, 1.0, False).run([seg]).seconds == pytest.approx(1.002)


def _gpipe(times_s: dict, n_mb: int):
    """Two ranks, one stage each, GPipe over n_mb microbatches; every action `times_s[kind]`."""
    from torchtitan.planning.step_time import model as step_time

    order = {
        r: [(r, "F", i) for i in range(n_mb)] + [(r, "B", i) for i in range(n_mb)] for r in (0, 1)
    }
    times = {
        r: step_time.RankTimes(
            step_time.Timed(),
            {(r, k, i): step_time.Timed(s) for k, s in times_s.items() for i in range(n_mb)},
            step_time.Timed(),
        )
        for r in (0, 1)
    }
    return order, times


def test_a_cpu_pipeline_rank_that_waits_leaves_its_core_to_the_others():
    """Before: every action of a CPU pipeline took its time with all ranks computing (4 ranks
    on 2 cores at half speed each), also while half of them wait for a neighbour; the pick
    check's PP 2 layouts (4 ranks) were predicted 20-30% slow. Here rank 0's forwards and
    rank 1's backwards run alone at twice the speed: GPipe, 2 microbatches, 1 s actions."""
    from torchtitan.planning.step_time import pipeline as pipeline_time

    order, times = _gpipe({"F": 1.0, "B": 1.0}, 2)
    args = (order, {0: 0, 1: 1}, times, 0.0, 2)
    assert pipeline_time.pipeline_seconds(*args)[0] == pytest.approx(6.0)
    # alone 0.5 s; F1 (rank 0) beside F0 (rank 1) 1 s; rank 1's F1 and B0 alone; the two B
    # beside each other; rank 0's last B alone
    end, busy = pipeline_time.pipeline_seconds(*args, rates=(1.0, 2.0, 1.0))
    assert end == pytest.approx(4.0)
    assert busy == {0: pytest.approx(3.0), 1: pytest.approx(3.0)}
    # the same speed whatever runs: the plain event simulation, to the last digit
    for mb in (1, 3):
        order, times = _gpipe({"F": 1.0, "B": 2.5}, mb)
        args = (order, {0: 0, 1: 1}, times, 0.3, 2)
        shared_end, shared_busy = pipeline_time.pipeline_seconds(*args, rates=(1.0, 1.0, 1.0))
        end, busy = pipeline_time.pipeline_seconds(*args)
        assert shared_end == pytest.approx(end, rel=1e-12)
        assert shared_busy == pytest.approx(busy, rel=1e-12)


def test_busy_rates_follow_the_measured_sharing_of_the_machines_cores():
    from torchtitan.planning.step_time import cpu_sharing

    cpu = dataclasses.replace(
        H100, host_async=False, cores=2, thread_speedup=1.8, sharing={"2": 1.1, "4": 2.2}
    )
    # 4 ranks as 2 pipelines of 2 stages: one rank of each computing = 2 processes (1.1),
    # both = 4 (2.2): twice the speed while one waits
    assert cpu_sharing.busy_rates(cpu, 4, 2) == pytest.approx((1.0, 2.0, 1.0))
    assert cpu_sharing.busy_rates(cpu, 2, 2) == pytest.approx((1.0, 1.1, 1.0))
    assert cpu_sharing.busy_rates(cpu, 4, 1) == ()  # no pipeline
    assert cpu_sharing.busy_rates(cpu, 1, 1) == ()
    assert cpu_sharing.busy_rates(H100, 16, 2) == ()  # a GPU rank has its own device


def test_the_fitted_time_factor_scales_every_ops_time():
    cpu = dataclasses.replace(H100, host_async=False)
    for op in ("gemm", "grouped_gemm", "attention", "memory"):
        base = op_seconds(op, 1e9, 1 << 20, "float32", cpu, compiled=False, head_dim=64)
        fitted = op_seconds(
            op,
            1e9,
            1 << 20,
            "float32",
            dataclasses.replace(cpu, time_factor=1.25),
            compiled=False,
            head_dim=64,
        )
        assert fitted == pytest.approx((1.25 * base[0], 1.25 * base[1]))
    assert all(p.time_factor == 1.0 for p in hardware.PROFILES.values())  # GPUs: clock_factor


def test_the_calibration_row_is_predicted_from_the_profile_it_is_fitted_to():
    """time_factor = measured / predicted of the debug Llama3 step: the prediction comes from
    the profile without its factor, so a machine twice as fast in every micro-benchmark
    predicts the row in half the time (and fits twice the factor)."""
    from torchtitan.planning.step_time import cpu_bench

    cpu = dataclasses.replace(
        H100,
        host_async=False,
        peak_tflops={"float32": 0.1, "bfloat16": 0.4},
        hbm_gbps=80.0,
        host_us_per_op=5.0,
        time_factor=3.0,  # ignored: the row is predicted as measured by the micro-benchmarks
    )
    fast = dataclasses.replace(
        cpu, peak_tflops={"float32": 0.2, "bfloat16": 0.8}, hbm_gbps=160.0, host_us_per_op=2.5
    )
    measured, predicted = cpu_bench.calibration_seconds(cpu)
    _, predicted_fast = cpu_bench.calibration_seconds(fast)
    assert measured > 0 and predicted > 0
    assert predicted_fast == pytest.approx(predicted / 2, rel=1e-9)
