"""HeldForBackward: what forward leaves alive for backward, tensors from before it excluded."""

import torch
from torch import nn

from torchtitan.observe.held_for_backward import HeldForBackward


def test_views_of_the_parameters_are_not_held():
    # SimpleFSDP reads its parameters' local shards through a view (DTensor.to_local()):
    # autograd saves that view for the matmul's backward, but its storage is the parameter's,
    # alive before and after the step.
    lin = nn.Linear(64, 64, bias=False)
    x = torch.randn(8, 64, requires_grad=True)
    with HeldForBackward(lin.parameters()) as probe:
        y = (x @ lin.weight.view(64, 64).t()).relu()
    assert probe.held_bytes() == y.nbytes  # relu's output, saved for its backward


def test_a_parameter_storage_filled_during_forward_is_held():
    # FSDP2's unsharded parameters: persistent tensors whose storage is resized from 0 bytes
    # by the all-gather in forward and kept for backward.
    unsharded = torch.empty(64, 64)
    unsharded.untyped_storage().resize_(0)
    x = torch.randn(8, 64, requires_grad=True)
    with HeldForBackward([unsharded]) as probe:
        unsharded.untyped_storage().resize_(64 * 64 * 4)
        with torch.no_grad():
            unsharded.copy_(torch.randn(64, 64))
        y = x @ unsharded.view(64, 64).t()
    assert probe.held_bytes() == 64 * 64 * 4 + y.nbytes
