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

The kernel is the flavor's `attn_backend` (models/common/attn_backend.py): SDPA, or on CUDA
FlexAttention with a document-causal BlockMask or varlen_attn over the window packed one
document per sequence. Measured in torch 2.13.0+cpu, neither trains on CPU:
`flex_attention` raises "FlexAttention does not support backward on CPU. Please set the input
requires_grad to False or use another device." (eager and compiled; its forward without
gradients equals SDPA's within 3e-7), and `varlen_attn` raises "Could not run
'aten::_flash_attention_forward' with arguments from the 'CPU' backend" (fp32 and bf16). There,
and under context parallel (whose ring calls SDPA per chunk), flex and varlen flavors compute
the same document-causal attention through SDPA, and say so once per run.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor

from torchtitan.distributed.context_parallel import ContextParallel
from torchtitan.models.common.attn_backend import DOCUMENT_BACKENDS

logger = logging.getLogger(__name__)

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
    kernel: str = "sdpa"  # the kernel this forward runs: sdpa, flex or varlen (CUDA only)
    block_mask: object | None = None  # flex: the document-causal BlockMask
    # varlen: (cu_seqlens int32 [documents + 1] over the flattened batch, longest document);
    # None: each row is one document
    documents: tuple[torch.Tensor, int] | None = None


def attention_inputs(
    seq: int,
    rope_cache: torch.Tensor,
    doc_ids: torch.Tensor | None = None,
    cp: ContextParallel | None = None,
    *,
    backend: str = "sdpa",
) -> AttentionInputs:
    """`seq`: local tokens; `doc_ids`: [batch, global seq] for block_causal, else None (the
    window is one document); `backend`: the flavor's attn_backend."""
    device = rope_cache.device
    kernel = _kernel(backend, rope_cache, cp)
    if cp is not None:
        chunks = cp.chunk_keys(seq, doc_ids, device)
        return AttentionInputs(rope_cache[cp.positions(seq, device)], None, chunks, cp)
    rope = rope_cache[:seq]
    if kernel == "flex":
        return AttentionInputs(
            rope, None, None, None, kernel, block_mask=document_block_mask(doc_ids, seq, device)
        )
    if kernel == "varlen":
        packed = document_lengths(doc_ids) if doc_ids is not None else None
        return AttentionInputs(rope, None, None, None, kernel, documents=packed)
    mask = None
    if doc_ids is not None:
        same = doc_ids[:, :, None] == doc_ids[:, None, :]
        mask = same & torch.ones(seq, seq, dtype=torch.bool, device=device).tril()
        mask = mask.unsqueeze(1)
    return AttentionInputs(rope, mask, None, None)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    inputs: AttentionInputs,
    scale: float | None = None,
) -> torch.Tensor:
    """q [batch, heads, local seq, d]; k, v [batch, heads, keys, d] (keys: the local seq, or
    under CP the gathered global seq) -> [batch, heads, local seq, d_v]."""
    if inputs.cp is not None:
        return inputs.cp.attend(q, k, v, inputs.chunk_keys, scale)
    if inputs.kernel == "flex":
        return flex_attend(q, k, v, inputs.block_mask, scale)
    if inputs.kernel == "varlen":
        return varlen_attend(q, k, v, inputs.documents, scale)
    if inputs.mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=inputs.mask, scale=scale)


# ---------------------------------------------------------------- flex and varlen (CUDA)

_CPU_REASONS = {
    "flex": 'flex_attention: "FlexAttention does not support backward on CPU"',
    "varlen": "varlen_attn: \"Could not run 'aten::_flash_attention_forward' with arguments"
    " from the 'CPU' backend\"",
}


def _kernel(backend: str, rope_cache: torch.Tensor, cp: ContextParallel | None) -> str:
    """The kernel a forward runs for the flavor's backend: flex / varlen on CUDA without CP,
    else SDPA (the same document-causal attention)."""
    if backend not in DOCUMENT_BACKENDS:
        return "sdpa"
    if cp is None and rope_cache.device.type == "cuda":
        return backend
    # the memory simulation runs a CUDA job's step on fake CPU tensors: nothing to say there
    if not isinstance(rope_cache, FakeTensor):
        if cp is not None:
            _note_once(
                f"note: attn_backend={backend} under context parallel: the ring attends per chunk"
                " through SDPA with the same document-causal masks"
            )
        elif rope_cache.device.type == "cpu":
            _note_once(
                f"note: attn_backend={backend} cannot train on CPU in torch 2.13"
                f" ({_CPU_REASONS[backend]}); attending through SDPA with the same"
                " document-causal mask"
            )
    return "sdpa"


@functools.cache
def _note_once(line: str) -> None:
    logger.info(line)


def document_block_mask(doc_ids: torch.Tensor | None, seq: int, device: torch.device):
    """FlexAttention's BlockMask of the block-causal mask: a query sees the keys at or
    before it in its own document (doc_ids None: in the whole window)."""
    from torch.nn.attention.flex_attention import create_block_mask

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def same_document(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (doc_ids[b, q_idx] == doc_ids[b, kv_idx])

    # compiled on CUDA so that the [batch, seq, seq] mask is never materialised
    compiled = device.type == "cuda"
    if doc_ids is None:
        return create_block_mask(causal, None, None, seq, seq, device=device, _compile=compiled)
    batch = doc_ids.shape[0]
    return create_block_mask(same_document, batch, None, seq, seq, device=device, _compile=compiled)


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    # eager flex_attention materialises every score; compiled it is the fused kernel
    return torch.compile(flex_attention, dynamic=False)


def flex_attend(q, k, v, block_mask, scale: float | None = None) -> torch.Tensor:
    """FlexAttention under `block_mask` (compiled on CUDA; eager elsewhere, forward only)."""
    if q.device.type == "cuda":
        return _compiled_flex()(q, k, v, block_mask=block_mask, scale=scale)
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention(q, k, v, block_mask=block_mask, scale=scale)


def document_lengths(doc_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """[batch, seq] document ids -> (cu_seqlens int32 [documents + 1] over the flattened
    batch, the longest document's length). Every row starts a document. Two host syncs (the
    starts' count, the longest), once per forward."""
    starts = torch.ones_like(doc_ids, dtype=torch.bool)
    starts[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    first = starts.flatten().nonzero().flatten()
    cu = torch.cat([first, first.new_full((1,), doc_ids.numel())]).to(torch.int32)
    return cu, int((cu[1:] - cu[:-1]).max())


def _varlen(*args, **kwargs):
    from torch.nn.attention.varlen import varlen_attn

    return varlen_attn(*args, **kwargs)


def varlen_attend(q, k, v, documents, scale: float | None = None) -> torch.Tensor:
    """varlen_attn over the window packed one document per sequence, causal within each.
    `documents`: document_lengths' result, or None (each row one document)."""
    batch, heads, seq, _ = q.shape
    if documents is None:
        cu = torch.arange(0, (batch + 1) * seq, seq, dtype=torch.int32, device=q.device)
        documents = (cu, seq)
    cu, longest = documents
    dtype = q.dtype
    # the flash kernel takes 16-bit inputs only
    low = dtype if dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
    if low != dtype and not torch.compiler.is_compiling():  # a log call would break the graph
        _note_once(
            "note: attn_backend=varlen: the flash kernel takes bf16 / fp16; fp32 q, k, v"
            " are cast to bf16 for it"
        )

    def pack(t):  # [batch, heads, seq, d] -> [batch * seq, heads, d]
        return t.transpose(1, 2).reshape(batch * seq, t.shape[1], t.shape[-1]).to(low)

    out = _varlen(
        pack(q), pack(k), pack(v), cu, cu, longest, longest, scale=scale, window_size=(-1, 0)
    )
    return out.to(dtype).view(batch, seq, heads, -1).transpose(1, 2)
