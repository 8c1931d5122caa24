"""Attention over a packed window, shared by every model: the causal or per-document mask,
RoPE positions, and the scaled dot-product attention itself.

A model builds one `AttentionInputs` per forward (`attention_inputs`) and hands it to every
block: which global positions its tokens hold, and which keys each query may see.

- `causal`: every token attends to the tokens before it in the window.
- `block_causal`: only to those of its own document. Windows are cut from a stream of
  documents, so a window may start mid-document: document ids are counted from the BOS tokens
  of the window's inputs (`document_ids`), and the tokens before the first BOS are document 0.

Under context parallel (torchtitan/distributed/context_parallel.py) the model part holds a
`ContextParallel`: the window's rows are its two chunks of the sequence, their RoPE positions
and per-chunk keys and masks come from it, and so does the per-chunk attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from torchtitan.distributed.context_parallel import ContextParallel

ATTN_MASKS = ("causal", "block_causal")


def document_ids(inputs: torch.Tensor, token_id: int, starts: bool = True) -> torch.Tensor:
    """[batch, seq] int32: the document of each token, counted from the window's delimiters:
    BOS tokens (`starts`), or EOS tokens for a tokenizer without BOS (a document then begins
    after each EOS, which stays with the document it ends)."""
    marks = inputs == token_id
    ids = torch.cumsum(marks, dim=1, dtype=torch.int32)
    return ids if starts else ids - marks.to(torch.int32)


@dataclass
class AttentionInputs:
    """What every attention layer of one forward shares."""

    rope: torch.Tensor  # [local seq, rope dim]: the RoPE cache rows of the local tokens
    mask: torch.Tensor | None  # no CP: [batch, 1, seq, seq] bool (block_causal); None: causal
    chunk_keys: list[tuple[int, object]] | None  # CP: per local chunk (its key count, its mask)
    cp: ContextParallel | None


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
    chunks = cp.chunk_keys(seq, doc_ids, device)
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
    return inputs.cp.attend(q, k, v, inputs.chunk_keys, scale)
