"""Context parallel (CP): every sequence split over the ranks of a CP group.

The sequence is cut into 2 x CP chunks and rank r holds chunks r and 2CP-1-r (head and tail:
every rank then does the same causal work). Each rank computes Q/K/V for its tokens, gathers
K and V (or what they are made from) over the CP group in global order
(`ContextParallel.gather`: an autograd all-gather, whose backward reduce-scatters the
gradients), and each of its two query chunks attends only to the keys up to its own end,
with a lower-right causal mask (or the document mask's rows): equal work on every rank, and
the causal half of the full computation in total.

Two choices (parallelism keys): the load balancer `none` deals contiguous chunks instead
(rank r holds chunk r of CP; rank 0 then does the least causal work), and the rotate method
`alltoall` gathers nothing: K/V travel rank to rank round the group and attention is
merged chunk by chunk by log-sum-exp (distributed/ring_attention.py).

This module knows no model: it works on tensors (a model's inputs, labels, keys, values,
document ids) and sets one attribute on a model part (`apply_context_parallel`). A model's
attention (models/common/attention.py) asks the `ContextParallel` it was given for its
chunks' keys and masks (`chunk_keys`) and hands them back to attend (`attend`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch.distributed import ProcessGroup
from torch.distributed._functional_collectives import all_gather_single_autograd, wait_tensor
from torch.nn.attention.bias import causal_lower_right

from torchtitan.distributed.ring_attention import ring_attend

if TYPE_CHECKING:
    from torch import nn

    from torchtitan.config.job_config import Parallelism
    from torchtitan.distributed.parallel_dims import ParallelDims


@dataclass
class ContextParallel:
    """This rank's place in its CP group (set on the model by its parallelize function), how
    its tokens were dealt (`balancer`: parallelism.context_parallel_load_balancer) and how
    K/V reach the other ranks (`rotate`: parallelism.context_parallel_rotate_method)."""

    group: ProcessGroup
    rank: int
    degree: int
    balancer: str = "headtail"  # "headtail" | "none"
    rotate: str = "allgather"  # "allgather" | "alltoall"

    @property
    def pieces(self) -> int:
        """How many equal chunks a sequence is cut into."""
        return 2 * self.degree if self.balancer == "headtail" else self.degree

    def chunks_of(self, rank: int) -> tuple[int, ...]:
        """The chunks CP rank `rank` holds, in its local order."""
        if self.balancer == "headtail":
            return rank, 2 * self.degree - 1 - rank
        return (rank,)

    @property
    def chunks(self) -> tuple[int, ...]:
        return self.chunks_of(self.rank)

    def shard(self, t: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's chunks of a global-length tensor (inputs, labels)."""
        parts = t.chunk(self.pieces, dim=dim)
        return torch.cat([parts[c] for c in self.chunks], dim=dim)

    def positions(self, local_len: int, device) -> torch.Tensor:
        n = local_len // len(self.chunks)
        return torch.cat([torch.arange(c * n, (c + 1) * n, device=device) for c in self.chunks])

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """[batch, local seq, ...] of every CP rank -> [batch, global seq, ...] in global order.
        Autograd-aware: its backward reduce-scatters the gradients back to their ranks.
        Under alltoall the tensor stays local: `attend` passes it round the ring itself."""
        if self.rotate == "alltoall":
            return x
        per_rank = len(self.chunks)
        n = x.shape[1] // per_rank
        full = all_gather_single_autograd(x.contiguous(), gather_dim=1, group=self.group)
        full = wait_tensor(full)  # op SAC keeps this wait with its gather (paired by their tensor)
        # gathered rank-major: rank 0's chunks, rank 1's, ...; chunk c sits at slot[c]
        slot = {
            c: r * per_rank + i for r in range(self.degree) for i, c in enumerate(self.chunks_of(r))
        }
        if per_rank == 1:
            return full  # contiguous chunks: rank order is global order
        return torch.cat([full.narrow(1, slot[c] * n, n) for c in range(self.pieces)], dim=1)

    def chunk_keys(
        self, seq: int, doc_ids: torch.Tensor | None, device
    ) -> list[tuple[int, object]]:
        """Per local chunk (of `seq` local tokens): its key count (the keys up to its own end)
        and its mask: lower-right causal, or with `doc_ids` ([batch, global seq]) the document
        mask's rows [batch, 1, chunk, keys]. On CUDA the causal one is torch's bias object.
        Under alltoall a causal mask is left to the ring (None: it knows the diagonal)."""
        n = seq // len(self.chunks)
        chunks = []
        for c in self.chunks:
            end = (c + 1) * n  # keys [0, end): everything up to this chunk's last token
            if doc_ids is None and (self.rotate == "alltoall" or device.type == "cuda"):
                # not materialized: 1 GiB at 128K / CP8
                chunks.append(
                    (end, None if self.rotate == "alltoall" else causal_lower_right(n, end))
                )
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
        """q [batch, heads, local seq, d]; k, v [batch, heads, global seq, d] (gathered; local
        under alltoall) -> [batch, heads, local seq, d_v]: each local chunk attends to its keys
        (`chunk_keys`)."""
        if self.rotate == "alltoall":
            return ring_attend(self, q, k, v, chunk_keys, scale=scale)
        n = q.shape[2] // len(self.chunks)
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


def apply_context_parallel(
    model: nn.Module, dims: ParallelDims, parallelism: Parallelism | None = None
) -> frozenset[str]:
    """Give a model part (ParallelDims `dims`) its place in its CP group, with the balancer and
    rotate method of `parallelism` (None: headtail, allgather); returns the groups whose
    gathers op SAC keeps (CP's K/V gathers: recomputing them would send them again)."""
    if dims.cp == 1:
        return frozenset()
    group = dims.cp_group()
    cp = ContextParallel(group, torch.distributed.get_rank(group), dims.cp)
    model.context_parallel = configured(cp, parallelism)
    return frozenset({group.group_name})


def configured(
    cp: ContextParallel | None, parallelism: Parallelism | None
) -> ContextParallel | None:
    """`cp` with the balancer and rotate method `parallelism` names (checks/layout.py refused
    the others before launch)."""
    if cp is None or parallelism is None:
        return cp
    return replace(
        cp,
        balancer=parallelism.context_parallel_load_balancer,
        rotate=parallelism.context_parallel_rotate_method,
    )
