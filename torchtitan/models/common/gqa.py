"""Grouped-query attention with RoPE, shared by Llama3 and Qwen3: `n_kv_heads` key/value
heads each serve n_heads / n_kv_heads query heads; `head_dim` is the model's (Qwen3's 128
need not equal dim / n_heads). Optionally QK-norm (Qwen3): one RMSNorm(head_dim) weight for
the queries and one for the keys, shared by all heads, applied before RoPE.

Head counts are read from tensor shapes, so the same code runs on TP-sharded weights (wq,
wk, wv column-split by heads, wo row-split).
"""

import torch
from torch import nn

from torchtitan.models.common.attention import AttentionInputs, attend
from torchtitan.models.common.rmsnorm import RMSNorm
from torchtitan.models.common.rope import apply_rope


class GroupedQueryAttention(nn.Module):
    def __init__(
        self,
        dim: int,
        n_heads: int,
        n_kv_heads: int,
        head_dim: int,
        qk_norm_eps: float | None = None,
    ):
        super().__init__()
        self.head_dim = head_dim
        self.wq = nn.Linear(dim, n_heads * head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * head_dim, bias=False)
        self.wo = nn.Linear(n_heads * head_dim, dim, bias=False)
        if qk_norm_eps is not None:
            self.q_norm = RMSNorm(head_dim, eps=qk_norm_eps)
            self.k_norm = RMSNorm(head_dim, eps=qk_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x: torch.Tensor, attn: AttentionInputs) -> torch.Tensor:
        bsz, seq, _ = x.shape
        q = self.wq(x).view(bsz, seq, -1, self.head_dim)
        k = self.wk(x).view(bsz, seq, -1, self.head_dim)
        v = self.wv(x).view(bsz, seq, -1, self.head_dim)
        if self.q_norm is not None:  # over each head's features, one weight for all heads
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, attn.rope), apply_rope(k, attn.rope)
        if attn.cp is not None:  # every CP rank's keys and values, in global order
            k, v = attn.cp.gather(k), attn.cp.gather(v)
        n_rep = q.shape[2] // k.shape[2]
        if n_rep > 1:  # grouped-query attention: each KV head serves n_rep query heads
            k = k.repeat_interleave(n_rep, dim=2)
            v = v.repeat_interleave(n_rep, dim=2)
        out = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn)
        return self.wo(out.transpose(1, 2).reshape(bsz, seq, -1))
