"""Attention over a packed window, shared by every model: the causal or per-document mask,
RoPE positions, and context parallel.

A model builds one `AttentionInputs` per forward (`attention_inputs`) and hands it to every
block: which global positions its tokens hold, and which keys each query may see.

- `causal`: every token attends to the tokens before it in the window.
- `block_causal`: only to those of its own document. Windows are cut from a stream of
  documents, so a window may start mid-document: document ids are counted from the BOS tokens
  of the window's inputs (`document_ids`), and the tokens before the first BOS are document 0.

Context parallel (CP, `ContextParallel`): the sequence is cut into 2 x CP chunks and rank r
holds chunks r and 2CP-1-r (head and tail: every rank then does the same causal work). Each
rank computes Q/K/V for its tokens, gathers K and V (or what they are made from) over the CP
group in global order (`ContextParallel.gather`: an autograd all-gather, whose backward
reduce-scatters the gradients), and each of its two query chunks attends only to the keys up
to its own end, with a lower-right causal mask (or the document mask's rows): equal work on
every rank, and the causal half of the full computation in total.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.distributed import ProcessGroup
from torch.distributed._functional_collectives import all_gather_single_autograd, wait_tensor
from torch.nn.attention.bias import causal_lower_right

ATTN_MASKS = ("causal", "block_causal")


def document_ids(inputs: torch.Tensor, token_id: int, starts: bool = True) -> torch.Tensor:
    """[batch, seq] int32: the document of each token, counted from the window's delimiters:
    BOS tokens (`starts`), or EOS tokens for a tokenizer without BOS (a document then begins
    after each EOS, which stays with the document it ends)."""
    marks = inputs == token_id
    ids = torch.cumsum(marks, dim=1, dtype=torch.int32)
    return ids if starts else ids - marks.to(torch.int32)


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


@dataclass
class AttentionInputs:
    """What every attention layer of one forward shares."""

    rope: torch.Tensor  # [local seq, rope dim]: the RoPE cache rows of the local tokens
    mask: torch.Tensor | None  # no CP: [batch, 1, seq, seq] bool (block_causal); None: causal
    chunk_keys: list[tuple[int, object]] | None  # CP: per local chunk (its key count, its mask)
    cp: ContextParallel | None


def causal_chunk_mask(n: int, end: int, device) -> torch.Tensor:
    """[n, end] bool: a chunk of n queries whose last is key end-1 sees keys up to its own."""
    return torch.ones(n, end, dtype=torch.bool, device=device).tril(end - n)


def attention_inputs(
    seq: int,
    rope_cache: torch.Tensor,
    doc_ids: torch.Tensor | None = None,
    cp: ContextParallel | None = None,
) -> AttentionInputs:
    """`seq`: local tokens; `doc_ids`: [batch, global seq] for block_causal, else None."""
    device = rope_cache.device
    if cp is None:
        mask = None
        if doc_ids is not None:
            same = doc_ids[:, :, None] == doc_ids[:, None, :]
            mask = (same & torch.ones(seq, seq, dtype=torch.bool, device=device).tril()).unsqueeze(
                1
            )
        return AttentionInputs(rope_cache[:seq], mask, None, None)
    n = seq // 2
    chunks = []
    for c in cp.chunks:
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
    return AttentionInputs(rope_cache[cp.positions(seq, device)], None, chunks, cp)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    inputs: AttentionInputs,
    scale: float | None = None,
) -> torch.Tensor:
    """q [batch, heads, local seq, d]; k, v [batch, heads, keys, d] (keys: the local seq, or
    under CP the gathered global seq) -> [batch, heads, local seq, d_v]."""
    if inputs.cp is None:
        if inputs.mask is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=inputs.mask, scale=scale)
    n = q.shape[2] // 2
    outs = [
        F.scaled_dot_product_attention(
            q[:, :, i * n : (i + 1) * n], k[:, :, :end], v[:, :, :end], attn_mask=mask, scale=scale
        )
        for i, (end, mask) in enumerate(inputs.chunk_keys)
    ]
    return torch.cat(outs, dim=2)


def apply_context_parallel(model, dims) -> frozenset[str]:
    """Give a model part (ParallelDims `dims`) its place in its CP group; returns the groups
    whose gathers op SAC keeps (CP's K/V gathers: recomputing them would send them again)."""
    if dims.cp == 1:
        return frozenset()
    group = dims.cp_group()
    model.context_parallel = ContextParallel(group, torch.distributed.get_rank(group), dims.cp)
    return frozenset({group.group_name})
