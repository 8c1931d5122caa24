"""A compiled block handed a tensor whose collective is still in flight (TP's async
redistributes return an AsyncCollectiveTensor, e.g. the embeddings' reduce-scatter feeding
the first block) must still pass the gradient back to it (apply_compile waits on such
inputs before the graph)."""

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn

from torchtitan.config.job_config import Compile
from torchtitan.distributed.compile import apply_compile


class _AsyncSum(torch.autograd.Function):
    """An all-reduce whose output is still in flight, as DTensor's async redistribute returns
    it: the autograd history is on the wrapper, the wrapped tensor has none."""

    @staticmethod
    def forward(ctx, x):
        return funcol.all_reduce(x, "sum", dist.group.WORLD)

    @staticmethod
    def backward(ctx, grad):
        return grad


class _Identity(torch.autograd.Function):
    """What FSDP2's pre-forward does to a unit's inputs (RegisterPostBackwardFunction)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


def _input_grad(block: nn.Module, through_identity: bool) -> torch.Tensor:
    x = torch.arange(12, dtype=torch.float32).view(3, 4).requires_grad_()
    h = _AsyncSum.apply(x)
    assert isinstance(h, funcol.AsyncCollectiveTensor) and h.requires_grad
    if through_identity:
        h = _Identity.apply(h)
    block(h).pow(2).sum().backward()
    return x.grad


def test_compiled_block_passes_the_gradient_to_an_async_collective_input(gloo_world):
    torch.manual_seed(0)
    layers = nn.ModuleDict({"0": nn.Linear(4, 4)})
    expected = _input_grad(layers["0"], through_identity=False)
    assert expected.abs().sum() > 0
    apply_compile(layers, Compile(enable=True, backend="aot_eager"))
    for through_identity in (False, True):  # without the wait: an error, or silently zero
        got = _input_grad(layers["0"], through_identity)
        assert got is not None and torch.equal(got, expected), through_identity
