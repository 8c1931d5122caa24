"""Tensor-parallel helpers shared by the models' TP shardings."""

import contextlib
from contextlib import AbstractContextManager

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, distribute_module
from torch.distributed.tensor.parallel import ParallelStyle, loss_parallel


def loss_parallel_context(enabled: bool) -> AbstractContextManager:
    """Cross-entropy on vocabulary-sharded logits (forward and backward must both run in it)."""
    return loss_parallel() if enabled else contextlib.nullcontext()


class ReplicateParallel(ParallelStyle):
    """Parameters replicated over TP as DTensors; plain tensors in and out.

    For small modules TP does not split (LoRA down-projections, their norms, a MoE router).
    `input_layout` says how the plain input is laid out over the TP ranks: Replicate (every
    rank holds the same tokens; the weight gradient is the same on every rank) or Shard(d)
    (each rank holds its own tokens, as a MoE under sequence parallel does; the weight
    gradient is then partial and DTensor sums it over TP). `partial_output_grad`: the output
    feeds per-rank shards of work, so its gradient is summed over TP on the way back.
    """

    def __init__(self, input_layout: Placement = Replicate(), partial_output_grad: bool = False):
        super().__init__()
        self.input_layout, self.partial_output_grad = input_layout, partial_output_grad

    def _prepare_input(self, mod, inputs, device_mesh):
        return tuple(
            DTensor.from_local(x, device_mesh, [self.input_layout], run_check=False)
            if isinstance(x, torch.Tensor) and not isinstance(x, DTensor)
            else x
            for x in inputs
        )

    def _prepare_output(self, mod, outputs, device_mesh):
        if not isinstance(outputs, DTensor):
            return outputs
        # A replicated value consumed by per-rank shards of work (e.g. every rank's slice of
        # heads) gets a partial gradient on each rank: declare it so and DTensor sums it.
        return outputs.to_local(grad_placements=[Partial()] if self.partial_output_grad else None)

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return distribute_module(
            module, device_mesh, None, self._prepare_input, self._prepare_output
        )
