"""Ring attention: context parallel's alltoall rotate method.

No rank gathers every key. Each rank's K/V (its chunks of the sequence, one tensor: K and V
side by side) travel round the CP group, one hop per round (`shift`: an autograd all-to-all
that sends to rank + 1 and receives from rank - 1; its backward sends the gradients back the
other way). In round t a rank holds the K/V of rank - t and attends its query chunks to the
key chunks a causal mask lets them see (none of a later chunk, all of an earlier one, the
lower triangle of its own); the partial results are merged by their log-sum-exp, which gives
the softmax over all keys exactly (up to rounding). The next round's hop is issued before the
current round's attention, so that on a GPU the transfer overlaps the compute.

Per query / key chunk pair the attention is written out (scores, log-sum-exp, weights): it
needs the log-sum-exp, which SDPA does not return on every backend, and autograd then
differentiates the merge as well. Scores are computed in fp32.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.distributed._functional_collectives import all_to_all_single_autograd

# A masked score: finite, so that a query row that sees no key of a pair gives weights and a
# log-sum-exp that merge to 0 (exp(-1e30 - x) == 0) and no NaN, forward or backward.
MASKED = -1e30


def shift(x: torch.Tensor, cp: Any) -> torch.Tensor:  # cp: context_parallel.ContextParallel
    """`x` sent to CP rank + 1; returns what rank - 1 sent (the same shape): one all-to-all."""
    flat = x.reshape(-1)
    send = [0] * cp.degree
    recv = [0] * cp.degree
    send[(cp.rank + 1) % cp.degree] = flat.numel()
    recv[(cp.rank - 1) % cp.degree] = flat.numel()
    return all_to_all_single_autograd(flat.contiguous(), recv, send, cp.group).view(x.shape)


def _block(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """One query chunk against one key chunk: (softmax(scores) @ v, log-sum-exp of the scores)."""
    scores = torch.matmul(q.float(), k.float().transpose(-2, -1)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, MASKED)
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    return torch.matmul(torch.exp(scores - lse), v.float()), lse


def _merge(state, out: torch.Tensor, lse: torch.Tensor):
    if state is None:
        return out, lse
    acc, acc_lse = state
    merged = torch.logaddexp(acc_lse, lse)
    return acc * torch.exp(acc_lse - merged) + out * torch.exp(lse - merged), merged


def _pair_mask(mask, qc: int, kc: int, n: int, diagonal: torch.Tensor) -> torch.Tensor | None:
    """What query chunk `qc` sees of key chunk `kc` (kc <= qc): its columns of the chunk's
    document mask ([batch, 1, n, keys up to its end]), else causal: the lower triangle on
    the diagonal, everything before it."""
    if isinstance(mask, torch.Tensor):
        return mask[..., kc * n : (kc + 1) * n]
    return diagonal if kc == qc else None


def ring_attend(
    cp: Any,  # context_parallel.ContextParallel
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    chunk_keys: list[tuple[int, object]],
    *,
    scale: float | None = None,
) -> torch.Tensor:
    """q [batch, heads, local seq, d]; k, v [batch, heads, local seq, d / d_v] (this rank's)
    -> [batch, heads, local seq, d_v]; `chunk_keys`: ContextParallel.chunk_keys (a document
    mask per local chunk, or None: causal)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    local = cp.chunks
    n = q.shape[2] // len(local)
    diagonal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    width = k.shape[-1]
    kv = torch.cat([k, v], dim=-1)  # one message per hop
    states: list = [None] * len(local)
    for t in range(cp.degree):
        following = shift(kv, cp) if t < cp.degree - 1 else None
        held = cp.chunks_of((cp.rank - t) % cp.degree)
        last_used = False
        for j, kc in enumerate(held):
            kj = kv[:, :, j * n : (j + 1) * n]
            for i, qc in enumerate(local):
                if kc > qc:  # causal: a later chunk is invisible
                    continue
                last_used = True
                mask = _pair_mask(chunk_keys[i][1], qc, kc, n, diagonal)
                out, lse = _block(
                    q[:, :, i * n : (i + 1) * n], kj[..., :width], kj[..., width:], mask, scale
                )
                states[i] = _merge(states[i], out, lse)
        if following is None and not last_used:
            # Every hop's backward is a collective all ranks must run: a rank that sees none
            # of the last K/V it received (rank 0 under the balancer none) ties them to its
            # output with weight 0, so that its autograd still sends their gradients back.
            out, lse = states[0]
            states[0] = (out + 0.0 * kv.sum(), lse)
        kv = following
    return torch.cat([s[0] for s in states], dim=2).to(q.dtype)
