"""Llama3: GQA attention with RoPE (common/gqa.py), RMSNorm, SwiGLU feed-forward.

Blocks live in an `nn.ModuleDict` keyed by layer index, so a pipeline stage that keeps
layers 3..5 still calls them `layers.3` .. `layers.5`; a stage without embeddings or
output has those attributes set to None and passes hidden states through.
Head counts are read from tensor shapes, so the same code runs on TP-sharded weights.
"""

from functools import partial

import torch
from torch import nn

from torchtitan.distributed.plan import FsdpUnit
from torchtitan.models.common.attention import AttentionInputs, attention_inputs
from torchtitan.models.common.feed_forward import FeedForward
from torchtitan.models.common.gqa import GroupedQueryAttention
from torchtitan.models.common.init import init_parameters, transformer_init_fn
from torchtitan.models.common.rmsnorm import RMSNorm
from torchtitan.models.common.rope import rope_cache
from torchtitan.models.llama3.args import Llama3Args


class TransformerBlock(nn.Module):
    def __init__(self, args: Llama3Args):
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.attention = GroupedQueryAttention(
            args.dim, args.n_heads, args.n_kv_heads, args.head_dim
        )
        self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.feed_forward = FeedForward(args.dim, args.ffn_hidden_dim)

    def forward(self, x: torch.Tensor, attn: AttentionInputs) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), attn)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """Embeddings, `n_layers` blocks (ModuleDict "0".."n-1"), final norm, output projection.
    Implements models.protocol.TrainableModel."""

    first_stage_modules = ("tok_embeddings",)  # kept by the first pipeline stage only
    last_stage_modules = ("norm", "output")  # kept by the last pipeline stage only

    def __init__(self, args: Llama3Args):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(args) for i in range(args.n_layers)})
        self.norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        self.register_buffer("rope", self._rope(), persistent=False)
        self.context_parallel = None  # a ContextParallel, set by parallelize_llama under CP
        self.sequence_shards = (
            1  # the residual stream is split over the sequence into this many (TP)
        )

    def _rope(self, device=None) -> torch.Tensor:
        a = self.args
        return rope_cache(
            a.max_seq_len,
            a.head_dim,
            a.rope_theta,
            a.rope_scaling,
            device=device,
            factor=a.rope_factor,
        )

    def forward(self, tokens: torch.Tensor, doc_ids: torch.Tensor | None = None) -> torch.Tensor:
        """tokens [batch, seq] (or hidden states on a later pipeline stage); `doc_ids`
        [batch, global seq] under the block-causal mask (attention.document_ids)."""
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        # the tokens attention sees: this CP rank's (TP's sequence parallel splits them between blocks)
        attn = attention_inputs(
            h.shape[1] * self.sequence_shards,
            self.rope,
            doc_ids,
            self.context_parallel,
            backend=self.args.attn_backend,
        )
        for layer in self.layers.values():
            h = layer(h, attn)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h

    def fsdp_units(self) -> list[FsdpUnit]:
        """FSDP units in forward order: the embeddings, then each block."""
        units = [FsdpUnit("tok_embeddings")] if self.tok_embeddings is not None else []
        return units + [FsdpUnit(f"layers.{k}", block=f"layers.{k}") for k in self.layers.keys()]

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token as torchtitan reports them (Megatron-LM's paper has the same
        attention term): 6 per non-embedding weight (forward + backward) plus 12 x layers x
        heads x head_dim x seq for attention scores and values, not halved for the causal mask."""
        a = self.args
        n_params = sum(p.numel() for p in self.parameters())
        return (
            6.0 * (n_params - self.tok_embeddings.weight.numel())
            + 12.0 * a.n_layers * a.n_heads * a.head_dim * seq_len
        )

    def init_weights(self, seed: int, device) -> None:
        """Materialised (to_empty) model -> deterministic weights and the RoPE cache."""
        init_parameters(self, partial(transformer_init_fn, dim=self.args.dim), seed, device)
        self.rope = self._rope(device=device)
