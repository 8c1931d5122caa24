"""SimpleFSDP's unit machinery on a 1-rank gloo group in this process (no collective runs:
a group of size 1 gathers nothing), against the same module without it."""

import copy

import pytest
import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from torchtitan.distributed.parallel_dims import DataParallelMesh, MeshDim
from torchtitan.distributed.plan import Decision, FsdpUnit, PartPlan, RegionSpec
from torchtitan.distributed.simple_fsdp import simple_fsdp


@pytest.fixture(scope="module")
def mesh(gloo_world):
    return init_device_mesh("cpu", (1,), mesh_dim_names=("dp_shard",))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 4)

    def forward(self, x):
        return x + self.b(torch.relu(self.a(x)))


def _pair(mesh, regather_by_hooks=False, once_per_step=False):
    """The block as one root unit whose plan makes it regather by hooks (resharded, eager, no
    AC region), gather once per step (kept, 2 pipeline microbatches), or neither."""
    torch.manual_seed(0)
    plain = Block()
    sharded = copy.deepcopy(plain)
    region = RegionSpec("none", "recompute", by_hooks=True) if regather_by_hooks else None
    unit = FsdpUnit("", decision=Decision(regather_by_hooks, "test"), region=region)
    plan = PartPlan(0, (unit,), microbatches=2 if once_per_step or regather_by_hooks else 1)
    dp = DataParallelMesh(mesh, (MeshDim.DP_SHARD,), MeshDim.DP_SHARD, None)
    simple_fsdp(sharded, plan, lambda kind: dp, "float32", "float32")
    return plain, sharded


def _grads(module):
    return {
        n: (p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad).clone()
        for n, p in module.named_parameters()
    }


def test_names_state_dict_and_gradients_are_those_of_the_plain_module(mesh):
    plain, sharded = _pair(mesh)
    assert [n for n, _ in sharded.named_parameters()] == [n for n, _ in plain.named_parameters()]
    assert sharded.state_dict().keys() == plain.state_dict().keys()
    x = torch.randn(3, 4)
    plain(x).sum().backward()
    sharded(x).sum().backward()
    assert all(torch.equal(g, _grads(plain)[n]) for n, g in _grads(sharded).items())


def test_regathered_values_are_dropped_after_an_input_only_backward(mesh):
    plain, sharded = _pair(mesh, regather_by_hooks=True)
    x = torch.randn(3, 4, requires_grad=True)
    torch.autograd.grad(sharded(x).sum(), x)  # never reaches the unit's gather node
    assert sharded._simple_fsdp_unit.regather.values is None
    sharded(x).sum().backward()
    plain(x).sum().backward()
    assert sharded._simple_fsdp_unit.regather.values is None
    assert all(torch.equal(g, _grads(plain)[n]) for n, g in _grads(sharded).items())


def test_once_per_step_reduces_on_the_last_microbatch_and_refuses_stale_values(mesh):
    plain, sharded = _pair(mesh, once_per_step=True)
    state = sharded._simple_fsdp_unit.step
    xs = [torch.randn(3, 4), torch.randn(3, 4)]
    outs = [sharded(x) for x in xs]
    assert state.values is not None
    outs[0].sum().backward()
    assert state.backwards == 1 and state.values is not None  # kept for the second microbatch
    outs[1].sum().backward()
    assert state.backwards == 0 and state.values is None and state.grad is None
    for x in xs:
        plain(x).sum().backward()
    assert all(torch.allclose(g, _grads(plain)[n]) for n, g in _grads(sharded).items())
    # a step left open (one microbatch's backward never ran), then an update: refused
    sharded(xs[0])
    with torch.no_grad():
        for p in sharded.parameters():
            p.add_(1.0)
    with pytest.raises(RuntimeError, match="1 of 2|0 of 2"):
        sharded(xs[0])
