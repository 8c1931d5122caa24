"""The step-time model's CPU terms measured by the local profile (local_profile.py): FSDP2's
host time charged per hook it runs (a 1-rank mesh included: its hooks run without any
collective), and memory-bound ops beyond the last-level cache at DRAM's rate."""

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
