"""Qwen3, dense and MoE: grouped-query attention with QK-norm and RoPE (theta 1e6, no
scaling), RMSNorm, SwiGLU blocks or Qwen's MoE blocks (softmax router, top-k renormalised, no
shared experts), and output weights tied to the input embedding where the flavor says so.

Conventions shared with llama3 (models/protocol.py): blocks in an `nn.ModuleDict` keyed by
layer index; a pipeline stage without embeddings / norm / output has them set to None.

Tied embeddings are ONE parameter, `tok_embeddings.weight`, which `output` uses too
(`tied_weights`); the root FSDP unit holds it, so it is gathered once per step for both
uses. Under PP the first stage holds the embedding and the last stage its copy as
`output.weight`: the framework keeps them equal (models/tied.py).
"""

from functools import partial

import torch
from torch import nn

from torchtitan.distributed.plan import FsdpUnit, UnitKind
from torchtitan.models.common.attention import AttentionInputs, attention_inputs
from torchtitan.models.common.feed_forward import FeedForward
from torchtitan.models.common.gqa import GroupedQueryAttention
from torchtitan.models.common.init import init_parameters, transformer_init_fn
from torchtitan.models.common.moe import (
    MoE,
    is_expert_stack,
    stage_switch_statistics,
    switch_balance_loss,
)
from torchtitan.models.common.rmsnorm import RMSNorm
from torchtitan.models.common.rope import rope_cache
from torchtitan.models.common.tied import retie
from torchtitan.models.qwen3.args import TIED, Qwen3Args, is_moe_layer


class TransformerBlock(nn.Module):
    def __init__(self, args: Qwen3Args, layer_id: int):
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.attention = GroupedQueryAttention(
            args.dim, args.n_heads, args.n_kv_heads, args.head_dim, qk_norm_eps=args.norm_eps
        )
        self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.moe_enabled = is_moe_layer(args, layer_id)
        if self.moe_enabled:
            self.moe = MoE(
                args.dim,
                args.moe_inter_dim,
                args.n_routed_experts,
                args.n_activated_experts,
                score_func=args.score_func,
                route_norm=args.route_norm,
                load_balance_coeff=args.load_balance_coeff,
                aux_loss_coeff=args.aux_loss_coeff,
                aux_loss_kind=args.moe.aux_loss_kind,
            )
        else:
            self.feed_forward = FeedForward(args.dim, args.ffn_hidden_dim)

    def forward(self, x: torch.Tensor, attn: AttentionInputs) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), attn)
        ffn = self.moe if self.moe_enabled else self.feed_forward
        return h + ffn(self.ffn_norm(h))


class Transformer(nn.Module):
    """Embeddings, `n_layers` blocks (ModuleDict "0".."n-1"), final norm, output projection.
    Implements models.protocol.TrainableModel."""

    first_stage_modules = ("tok_embeddings",)
    last_stage_modules = ("norm", "output")

    def __init__(self, args: Qwen3Args):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleDict(
            {str(i): TransformerBlock(args, i) for i in range(args.n_layers)}
        )
        self.norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        self.tied_weights = dict(TIED) if args.tie_word_embeddings else {}
        if self.tied_weights:
            self.output.weight = self.tok_embeddings.weight
        self.register_buffer("rope", self._rope(), persistent=False)
        self.context_parallel = None  # context_parallel.ContextParallel, set under CP
        self.sequence_shards = (
            1  # the residual stream is split over the sequence into this many (TP)
        )

    def _rope(self, device=None) -> torch.Tensor:
        a = self.args
        return rope_cache(a.max_seq_len, a.head_dim, a.rope_theta, scaling=False, device=device)

    def forward(
        self,
        tokens: torch.Tensor,
        balance: torch.Tensor | None = None,
        doc_ids: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """tokens [batch, seq] (or hidden states on a later pipeline stage); `doc_ids`
        [batch, global seq] under the block-causal mask (attention.document_ids).

        With the Switch balance loss on, a pipeline stage also passes on the routing
        statistics of the layers so far (`balance`, moe.stage_switch_statistics): a middle
        stage returns (hidden states, statistics), the last (logits, balance loss [1]), which the
        loss adds to the objective. The whole model returns logits; the trainer reads its
        balance loss from the layers (moe.moe_aux_loss)."""
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
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
        out = self.output(h) if self.output is not None else h
        staged = self.tok_embeddings is None or self.output is None
        if not (staged and self.args.moe is not None and self.args.aux_loss_coeff > 0):
            return out
        stats = stage_switch_statistics(self, balance, self.args.n_routed_experts, h.device)
        if self.output is None:
            return out, stats
        if not self.training:
            return out, torch.zeros(1, device=h.device)
        # [1], not a scalar: the schedule concatenates the microbatches' outputs
        return out, switch_balance_loss(
            [stats], self.args.n_activated_experts, self.args.aux_loss_coeff
        ).reshape(1)

    def fsdp_units(self) -> list[FsdpUnit]:
        """FSDP units in forward order: the embeddings (unless the output shares them: the
        root then holds the one parameter for both uses), each block, and a MoE block's
        routed experts as their own unit on the experts' data-parallel mesh."""
        shared = self.tied_weights and self.output is not None
        units = (
            [FsdpUnit("tok_embeddings")] if self.tok_embeddings is not None and not shared else []
        )
        for k, block in self.layers.items():
            units.append(FsdpUnit(f"layers.{k}", block=f"layers.{k}"))
            if block.moe_enabled:
                units.append(
                    FsdpUnit(f"layers.{k}.moe.experts", block=f"layers.{k}", kind=UnitKind.EXPERTS)
                )
        return units

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: 6 per active non-embedding weight (top-k of the routed
        experts) plus 12 x layers x heads x head_dim x seq for attention (see Llama3's). A
        tied output head counts as the matrix multiply it is."""
        a = self.args
        routed = sum(p.numel() for n, p in self.named_parameters() if is_expert_stack(n))
        active = routed * a.n_activated_experts / a.n_routed_experts if a.n_routed_experts else 0
        n_params = sum(p.numel() for p in self.parameters()) - routed + active
        emb = self.tok_embeddings.weight.numel() if self.tok_embeddings is not None else 0
        if self.tied_weights and self.output is not None:
            emb = 0  # the one matrix is the output head's multiply (the lookup is free)
        return 6.0 * (n_params - emb) + 12.0 * a.n_layers * a.n_heads * a.head_dim * seq_len

    def init_weights(self, seed: int, device) -> None:
        """Materialised (to_empty) model -> deterministic weights, zeroed MoE buffers and the
        RoPE cache. `to_empty` gave the tied modules a parameter each: one again (retie); a
        tied copy (a pipeline's last stage) is drawn as the embedding."""
        retie(self)
        init_parameters(
            self,
            partial(_init_fn, dim=self.args.dim, tied=bool(self.tied_weights)),
            seed,
            device,
            per_expert=is_expert_stack,
            aliases=self.tied_weights,
        )
        for m in self.modules():
            if isinstance(m, MoE):
                m.reset_buffers()
        self.rope = self._rope(device=device)


def _init_fn(fqn: str, dim: int, tied: bool):
    """transformer_init_fn; a tied embedding is drawn as the output head it also is (std
    dim^-0.5: unit-variance embeddings would give logits of std sqrt(dim))."""
    return transformer_init_fn(
        "output.weight" if tied and fqn == "tok_embeddings.weight" else fqn, dim
    )
