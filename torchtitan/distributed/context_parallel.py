"""Context parallel (CP): every sequence split over the ranks of a CP group.

The sequence is cut into 2 x CP chunks and rank r holds chunks r and 2CP-1-r (head and tail:
every rank then does the same causal work). Each rank computes Q/K/V for its tokens, gathers
K and V (or what they are made from) over the CP group in global order
(`ContextParallel.gather`: an autograd all-gather, whose backward reduce-scatters the
gradients), and each of its two query chunks attends only to the keys up to its own end,
with a lower-right causal mask (or the document mask's rows): equal work on every rank, and
the causal half of the full computation in total.

This module knows no model: it works on tensors (a model's inputs, labels, keys, values,
document ids) and sets one attribute on a model part (`apply_context_parallel`). A model's
attention (models/common/attention.py) asks the `ContextParallel` it was given for its
chunks' keys and masks (`chunk_keys`) and hands them back to attend (`attend`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch.distributed import ProcessGroup
from torch.distributed._functional_collectives import all_gather_single_autograd, wait_tensor
from torch.nn.attention.bias import causal_lower_right

if TYPE_CHECKING:
    from torch import nn

    from torchtitan.distributed.parallel_dims import ParallelDims


@dataclass
class ContextParallel:
    """This rank's place in its CP group (set on the model by its parallelize function)."""

    group: ProcessGroup
    rank: int
    degree: int

    @property
    def chunks(self) -> tuple[int, int]:
        return self.rank, 2 * self.degree - 1 - self.rank

    def shard(self, t: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's two chunks of a global-length tensor (inputs, labels)."""
        parts = t.chunk(2 * self.degree, dim=dim)
        return torch.cat([parts[c] for c in self.chunks], dim=dim)

    def positions(self, local_len: int, device) -> torch.Tensor:
        n = local_len // 2
        return torch.cat([torch.arange(c * n, (c + 1) * n, device=device) for c in self.chunks])

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """[batch, local seq, ...] of every CP rank -> [batch, global seq, ...] in global order.
        Autograd-aware: its backward reduce-scatters the gradients back to their ranks."""
        n = x.shape[1] // 2
        full = all_gather_single_autograd(x.contiguous(), gather_dim=1, group=self.group)
        full = wait_tensor(full)  # op SAC keeps this wait with its gather (paired by their tensor)
        # gathered: rank 0's (head, tail), rank 1's (head, tail), ...; chunk c sits at slot
        slots = {}
        for r in range(self.degree):
            slots[r] = 2 * r
            slots[2 * self.degree - 1 - r] = 2 * r + 1
        return torch.cat([full.narrow(1, slots[c] * n, n) for c in range(2 * self.degree)], dim=1)

    def chunk_keys(
        self, seq: int, doc_ids: torch.Tensor | None, device
    ) -> list[tuple[int, object]]:
        """Per local chunk (of `seq` local tokens): its key count (the keys up to its own end)
        and its mask: lower-right causal, or with `doc_ids` ([batch, global seq]) the document
        mask's rows [batch, 1, chunk, keys]. On CUDA the causal one is torch's bias object."""
        n = seq // 2
        chunks = []
        for c in self.chunks:
            end = (c + 1) * n  # keys [0, end): everything up to this chunk's last token
            if doc_ids is None and device.type == "cuda":
                chunks.append(
                    (end, causal_lower_right(n, end))
                )  # not materialized: 1 GiB at 128K / CP8
                continue
            mask = causal_chunk_mask(n, end, device)
            if doc_ids is not None:
                mask = (doc_ids[:, c * n : end, None] == doc_ids[:, None, :end]) & mask
                mask = mask.unsqueeze(1)
            chunks.append((end, mask))
        return chunks

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        chunk_keys: list[tuple[int, object]],
        scale: float | None = None,
    ) -> torch.Tensor:
        """q [batch, heads, local seq, d]; k, v [batch, heads, global seq, d] (gathered) ->
        [batch, heads, local seq, d_v]: each local chunk attends to its keys (`chunk_keys`)."""
        n = q.shape[2] // 2
        outs = [
            F.scaled_dot_product_attention(
                q[:, :, i * n : (i + 1) * n],
                k[:, :, :end],
                v[:, :, :end],
                attn_mask=mask,
                scale=scale,
            )
            for i, (end, mask) in enumerate(chunk_keys)
        ]
        return torch.cat(outs, dim=2)


def causal_chunk_mask(n: int, end: int, device) -> torch.Tensor:
    """[n, end] bool: a chunk of n queries whose last is key end-1 sees keys up to its own."""
    return torch.ones(n, end, dtype=torch.bool, device=device).tril(end - n)


def apply_context_parallel(model: nn.Module, dims: ParallelDims) -> frozenset[str]:
    """Give a model part (ParallelDims `dims`) its place in its CP group; returns the groups
    whose gathers op SAC keeps (CP's K/V gathers: recomputing them would send them again)."""
    if dims.cp == 1:
        return frozenset()
    group = dims.cp_group()
    model.context_parallel = ContextParallel(group, torch.distributed.get_rank(group), dims.cp)
    return frozenset({group.group_name})
