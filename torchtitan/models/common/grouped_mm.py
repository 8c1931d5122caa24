"""Grouped GEMM over rows sorted by group, as one opaque operator: `torchtitan::grouped_mm`.

`grouped_mm(x, w, offs)`: x [T, K] rows grouped in order, w [G, N, K] one weight per group
(stored as nn.Linear stores its weight: out x in), offs int32 [G] cumulative group ends
(offs[-1] == T; empty groups allowed) -> [T, N], rows of group g multiplied by w[g]^T.

Why an operator of our own rather than calling `torch._grouped_mm` directly: torch 2.13's
meta kernel of `aten._grouped_mm` accepts bfloat16 only, so any fake-tensor run (torch.compile
tracing, the memory simulation) of a float32 model fails in it, although the CPU kernel
computes float32 fine. Wrapped in a `torch.library.custom_op` with its own fake
implementation (the output shape) and autograd formula, torch.compile traces it in any
dtype as one node (inductor calls it as an external kernel, like aten's own fallback for
grouped GEMM), and forward and backward run the very kernel calls eager aten's autograd
makes, so compiled and eager results are bitwise equal:

- forward: `_grouped_mm(x, w^T, offs)`;
- backward (`torchtitan::grouped_mm_backward`, also opaque): grad_x = `_grouped_mm(dy, w,
  offs)`, grad_w = `_grouped_mm(dy^T, x, offs)` (2-D x 2-D with offsets: one [N, K] per
  group, summed over the group's rows; an empty group's is zero).

`torch._grouped_mm` needs the contraction dimension's stride to be a multiple of 16 bytes
(K and N multiples of 4 in float32, 8 in bfloat16) and rejects a stride-0 gradient: the
backward makes the incoming gradient contiguous first (a no-op when it already is).
Selective activation checkpointing sees `torchtitan.grouped_mm.default` in forward; it is
not in the op-level save list, so op SAC recomputes it (as it recomputed aten's).
"""

import torch

__all__ = ["grouped_mm"]


@torch.library.custom_op("torchtitan::grouped_mm", mutates_args=())
def _grouped_mm_op(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    return torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)


@_grouped_mm_op.register_fake
def _(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    torch._check(
        x.dim() == 2 and w.dim() == 3 and offs.dim() == 1,
        lambda: "grouped_mm: x [T, K], w [G, N, K], offs [G]",
    )
    torch._check(
        x.shape[1] == w.shape[2],
        lambda: f"grouped_mm: x has {x.shape[1]} columns, w expects {w.shape[2]}",
    )
    torch._check(offs.shape[0] == w.shape[0], lambda: "grouped_mm: one offset per group")
    return x.new_empty(x.shape[0], w.shape[1])


@torch.library.custom_op("torchtitan::grouped_mm_backward", mutates_args=())
def _grouped_mm_backward_op(
    grad: torch.Tensor, x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    grad = grad.contiguous()
    grad_x = torch._grouped_mm(grad, w, offs=offs)
    grad_w = torch._grouped_mm(grad.transpose(0, 1), x, offs=offs)
    return grad_x, grad_w


@_grouped_mm_backward_op.register_fake
def _(
    grad: torch.Tensor, x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return x.new_empty(x.shape), w.new_empty(w.shape)


def _setup_context(ctx, inputs, output) -> None:
    x, w, offs = inputs
    ctx.save_for_backward(x, w, offs)


def _backward(ctx, grad: torch.Tensor):
    x, w, offs = ctx.saved_tensors
    grad_x, grad_w = _grouped_mm_backward_op(grad, x, w, offs)
    return grad_x, grad_w, None


_grouped_mm_op.register_autograd(_backward, setup_context=_setup_context)


def grouped_mm(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """x [T, K] grouped by `offs` (int32 [G] cumulative ends), w [G, N, K] -> [T, N]: the rows
    of group g times w[g]^T (module docstring)."""
    return _grouped_mm_op(x, w, offs)
