"""DeepSeek-V3: multi-head latent attention (MLA) with YaRN RoPE, RMSNorm, dense SwiGLU in
the first blocks and DeepSeekMoE (shared + routed experts) in the others.

Conventions shared with llama3: blocks live in an `nn.ModuleDict` keyed by layer index, so a
pipeline stage keeps the global names; a stage without embeddings / norm / output has those
set to None and passes hidden states through. Head counts are read from tensor shapes, so
the same code runs on TP-sharded weights (wq / wq_b / wkv_b column-split, wo row-split).
"""

import math
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from torchtitan.distributed.plan import FsdpUnit, UnitKind
from torchtitan.models.common.attention import AttentionInputs, attend, attention_inputs
from torchtitan.models.common.feed_forward import FeedForward
from torchtitan.models.common.init import init_parameters, transformer_init_fn
from torchtitan.models.common.moe import MoE, is_expert_stack
from torchtitan.models.common.rmsnorm import RMSNorm
from torchtitan.models.common.rope import apply_rope
from torchtitan.models.deepseek_v3.args import DeepSeekV3Args, yarn_mscale, yarn_on


def yarn_active(args: DeepSeekV3Args) -> bool:
    """Whether YaRN applies: by `args.yarn`, by default only beyond the pre-training context."""
    return yarn_on(args)


def yarn_frequencies(args: DeepSeekV3Args) -> torch.Tensor:
    """float64 [qk_rope_head_dim / 2] RoPE frequencies, YaRN-interpolated when active.

    YaRN "by parts": a frequency that turns more than `beta_fast` times over the original
    context is kept (it resolves local order), one that turns fewer than `beta_slow` times
    is divided by `rope_factor` (it must stretch over the longer context), and a linear ramp
    over the frequency index blends the two in between.
    """
    dim, base = args.qk_rope_head_dim, args.rope_theta
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    if not yarn_active(args):
        return freqs

    def index_of(rotations: float) -> float:
        # the frequency index i whose wavelength fits `rotations` times in the old context:
        # original_seq_len / (2 pi base^(2i/dim)) = rotations, solved for i
        return (
            dim * math.log(args.original_seq_len / (rotations * 2 * math.pi)) / (2 * math.log(base))
        )

    low = max(math.floor(index_of(args.beta_fast)), 0)
    high = min(math.ceil(index_of(args.beta_slow)), dim - 1)
    span = max(high - low, 1e-3)  # avoid 0/0 when both ends meet
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / span).clamp(0, 1)
    keep = 1 - ramp  # 1 for fast (high) frequencies, 0 for slow ones
    return freqs * keep + freqs / args.rope_factor * (1 - keep)


def yarn_rope_cache(args: DeepSeekV3Args, device=None) -> torch.Tensor:
    """[max_seq_len, qk_rope_head_dim]: cos of every (position, frequency), then sin (the
    layout `common.rope.apply_rope` expects)."""
    freqs = yarn_frequencies(args).to(device)
    angles = torch.outer(torch.arange(args.max_seq_len, device=device, dtype=torch.float64), freqs)
    rows = torch.cat([angles.cos(), angles.sin()], dim=-1)
    if yarn_active(args) and args.yarn_temperature == "rope":
        rows = rows * yarn_mscale(
            args, 1.0
        )  # both q and k rotate by it: the RoPE scores scale by its square
    return rows.float()


def softmax_scale(args: DeepSeekV3Args) -> float:
    """1/sqrt(qk_head_dim), times YaRN's attention-temperature correction squared when
    active (DeepSeek folds the correction of both q and k into the softmax scale)."""
    scale = args.qk_head_dim**-0.5
    if yarn_active(args) and args.yarn_temperature == "softmax":
        m = yarn_mscale(args, args.mscale)
        scale *= m * m
    return scale


class Attention(nn.Module):
    """Multi-head latent attention: keys/values are expanded per head from a shared
    `kv_lora_rank` latent; each head's query/key = a non-rotated part plus a RoPE part, and
    the RoPE key (`k_pe`) is one vector shared by all heads."""

    def __init__(self, args: DeepSeekV3Args):
        super().__init__()
        self.q_lora_rank, self.kv_lora_rank = args.q_lora_rank, args.kv_lora_rank
        self.nope_dim, self.rope_dim, self.v_dim = (
            args.qk_nope_head_dim,
            args.qk_rope_head_dim,
            args.v_head_dim,
        )
        self.qk_head_dim = args.qk_head_dim
        q_out = args.n_heads * args.qk_head_dim
        if self.q_lora_rank == 0:
            self.wq = nn.Linear(args.dim, q_out, bias=False)
        else:
            self.wq_a = nn.Linear(args.dim, self.q_lora_rank, bias=False)
            self.q_norm = RMSNorm(self.q_lora_rank, eps=args.norm_eps)
            self.wq_b = nn.Linear(self.q_lora_rank, q_out, bias=False)
        self.wkv_a = nn.Linear(args.dim, self.kv_lora_rank + self.rope_dim, bias=False)
        self.kv_norm = RMSNorm(self.kv_lora_rank, eps=args.norm_eps)
        self.wkv_b = nn.Linear(
            self.kv_lora_rank, args.n_heads * (self.nope_dim + self.v_dim), bias=False
        )
        self.wo = nn.Linear(args.n_heads * self.v_dim, args.dim, bias=False)
        # Marks the RoPE key all heads share: with heads split by TP, each rank's gradient for
        # it covers only its heads, and TP makes this point sum them (identity otherwise).
        self.shared_key = nn.Identity()
        self.softmax_scale = softmax_scale(args)

    def forward(self, x: torch.Tensor, attn: AttentionInputs) -> torch.Tensor:
        bsz, seq, _ = x.shape
        q = self.wq(x) if self.q_lora_rank == 0 else self.wq_b(self.q_norm(self.wq_a(x)))
        q = q.view(bsz, seq, -1, self.qk_head_dim)  # heads from the shape: TP holds a slice
        q_nope, q_pe = q.split([self.nope_dim, self.rope_dim], dim=-1)
        q = torch.cat([q_nope, apply_rope(q_pe, attn.rope)], dim=-1)

        kv_latent, k_pe = self.wkv_a(x).split([self.kv_lora_rank, self.rope_dim], dim=-1)
        k_pe = apply_rope(
            self.shared_key(k_pe).unsqueeze(2), attn.rope
        )  # [bsz, seq, 1, rope]: one for all heads
        if attn.cp is not None:
            # CP gathers what K and V are made from: the latent and the rotated RoPE key,
            # kv_lora_rank + qk_rope_head_dim values per token, not heads x (qk + v) of them
            latent = attn.cp.gather(torch.cat([kv_latent, k_pe.squeeze(2)], dim=-1))
            kv_latent, k_pe = latent.split([self.kv_lora_rank, self.rope_dim], dim=-1)
            k_pe = k_pe.unsqueeze(2)
        keys = kv_latent.shape[1]
        kv = self.wkv_b(self.kv_norm(kv_latent)).view(bsz, keys, -1, self.nope_dim + self.v_dim)
        k_nope, v = kv.split([self.nope_dim, self.v_dim], dim=-1)
        k = torch.cat([k_nope, k_pe.expand(-1, -1, k_nope.shape[2], -1)], dim=-1)

        # SDPA's fused kernels want one head width for q, k and v: with v narrower, torch
        # 2.13 on CPU falls back to the math path (bmm + softmax, an [S, S] matrix per head,
        # which op-SAC would even save as a bmm output); FlashAttention-2 on CUDA also needs
        # equal widths. Zero-padding the narrower side changes no score and no output column.
        width = max(self.qk_head_dim, self.v_dim)
        q, k, v = (
            t if t.shape[-1] == width else F.pad(t, (0, width - t.shape[-1])) for t in (q, k, v)
        )
        out = attend(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn, scale=self.softmax_scale
        )
        out = out[..., : self.v_dim]
        return self.wo(out.transpose(1, 2).reshape(bsz, seq, -1))


def build_moe(args: DeepSeekV3Args) -> MoE:
    return MoE(
        args.dim,
        args.moe_inter_dim,
        args.n_routed_experts,
        args.n_activated_experts,
        n_shared_experts=args.n_shared_experts,
        n_groups=args.n_expert_groups,
        n_limited_groups=args.n_limited_groups,
        score_func=args.score_func,
        route_norm=args.route_norm,
        route_scale=args.route_scale,
        load_balance_coeff=args.load_balance_coeff,
        aux_loss_coeff=args.aux_loss_coeff,
    )


class TransformerBlock(nn.Module):
    """Pre-norm block: MLA, then a dense FFN (layer_id < n_dense_layers) or a MoE."""

    def __init__(self, args: DeepSeekV3Args, layer_id: int):
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.moe_enabled = layer_id >= args.n_dense_layers
        if self.moe_enabled:
            self.moe = build_moe(args)
        else:
            self.feed_forward = FeedForward(args.dim, args.inter_dim)

    def forward(self, x: torch.Tensor, attn: AttentionInputs) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), attn)
        ffn = self.moe if self.moe_enabled else self.feed_forward
        return h + ffn(self.ffn_norm(h))


class MTPModule(nn.Module):
    """One multi-token-prediction depth (DeepSeek-V3 report, section 2.2): the previous depth's
    hidden state and the embedding of the token one further ahead, normalised apart,
    concatenated (embedding first, as the published checkpoints' `eh_proj` expects),
    projected back to `dim` and run through one more transformer block. The parameter names
    are those the Hugging Face converter maps to `model.layers.{n_layers + k}.*`."""

    def __init__(self, args: DeepSeekV3Args, layer_id: int):
        super().__init__()
        self.enorm = RMSNorm(args.dim, eps=args.norm_eps)
        self.hnorm = RMSNorm(args.dim, eps=args.norm_eps)
        self.eh_proj = nn.Linear(2 * args.dim, args.dim, bias=False)
        self.block = TransformerBlock(args, layer_id)
        self.moe_enabled = self.block.moe_enabled
        self.norm = RMSNorm(args.dim, eps=args.norm_eps)  # the published `shared_head.norm`

    def forward(
        self, emb: torch.Tensor, h: torch.Tensor, attn: AttentionInputs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (this depth's hidden state, the next depth's input; its normalised form, the
        shared output head's input). Both come out of one call: every parameter use stays
        inside the unit's forward (FSDP gathers it there)."""
        h = self.block(self.eh_proj(torch.cat([self.enorm(emb), self.hnorm(h)], dim=-1)), attn)
        return h, self.norm(h)


class Transformer(nn.Module):
    """Embeddings, `n_layers` blocks (ModuleDict "0".."n-1"), final norm, output projection.
    Implements models.protocol.TrainableModel."""

    first_stage_modules = ("tok_embeddings",)  # kept by the first pipeline stage only
    # kept by the last pipeline stage only (the MTP modules' token embeddings travel there
    # from the first stage with the hidden state: forward's mtp_emb)
    last_stage_modules = ("norm", "output", "mtp")

    def __init__(self, args: DeepSeekV3Args):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleDict(
            {str(i): TransformerBlock(args, i) for i in range(args.n_layers)}
        )
        self.norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        # multi-token prediction: depth k is block n_layers + k of the published checkpoints
        self.mtp = (
            nn.ModuleDict(
                {str(k): MTPModule(args, args.n_layers + k) for k in range(args.mtp_depth)}
            )
            if args.mtp_depth
            else None
        )
        self.register_buffer("rope", yarn_rope_cache(args), persistent=False)
        self.context_parallel = (
            None  # context_parallel.ContextParallel, set by parallelize_deepseekv3 under CP
        )
        self.sequence_shards = (
            1  # the residual stream is split over the sequence into this many (TP)
        )

    def forward(
        self,
        tokens: torch.Tensor,
        mtp_emb: torch.Tensor | None = None,
        doc_ids: torch.Tensor | None = None,
        mtp_tokens: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """tokens [batch, seq] (or hidden states on a later pipeline stage); `doc_ids`
        [batch, global seq] under the block-causal mask (attention.document_ids).

        `mtp_tokens` [batch, mtp_depth, seq]: row k holds, at position t, the token t+1+k whose
        embedding MTP depth k takes (the trainer's labels shifted left by k). Given (and the
        model has MTP modules), the logits are [batch, (1 + mtp_depth) * seq, vocab]: the main
        ones, then each depth's (predicting token t+2+k), along the sequence. Without it, only
        the main logits (inference, export).

        Under pipeline parallel the MTP modules sit on the last stage, the embedding on the
        first: the first stage embeds the MTP tokens too and every stage passes them on with
        its hidden state (`mtp_emb` [batch, mtp_depth, seq, dim], a second stage input and
        output), so the embedding's gradient comes back through the pipeline like h's."""
        depth = self.args.mtp_depth if mtp_tokens is not None else 0
        if self.tok_embeddings is not None and depth:
            # one embedding call for the main and the MTP tokens (one FSDP gather, one TP
            # reduce-scatter): [batch, 1 + depth, seq] -> [batch * (1 + depth), seq, dim]
            ids = torch.cat([tokens.unsqueeze(1), mtp_tokens], dim=1)
            emb = self.tok_embeddings(ids.flatten(0, 1)).unflatten(
                0, (tokens.shape[0], ids.shape[1])
            )
            h, mtp_emb = emb[:, 0], emb[:, 1:]
        else:
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
        if self.output is None:  # an earlier pipeline stage
            h = self.norm(h) if self.norm is not None else h
            # a copy: stage outputs must be new tensors (the schedule detaches them in place; a
            # view or a stage input cannot be)
            return h if not depth else (h, mtp_emb.clone())
        if not depth or self.mtp is None:
            h = self.norm(h) if self.norm is not None else h
            return self.output(h)
        logits = [self.output(self.norm(h))]
        for module, e in zip(
            self.mtp.values(), mtp_emb.unbind(1)
        ):  # h: the last main block's output, before the norm
            h, normed = module(e, h, attn)
            logits.append(self.output(normed))
        return torch.cat(logits, dim=1)

    def fsdp_units(self) -> list[FsdpUnit]:
        """FSDP units in forward order; a MoE block's routed experts are their own unit, of
        their block, on the experts' data-parallel mesh."""
        units = [FsdpUnit("tok_embeddings")] if self.tok_embeddings is not None else []
        for k, block in self.layers.items():
            units.append(FsdpUnit(f"layers.{k}", block=f"layers.{k}"))
            if getattr(block, "moe_enabled", False):
                units.append(
                    FsdpUnit(f"layers.{k}.moe.experts", block=f"layers.{k}", kind=UnitKind.EXPERTS)
                )
        for k, module in (
            self.mtp or {}
        ).items():  # after the blocks, in forward order; each one AC region
            units.append(FsdpUnit(f"mtp.{k}", block=f"mtp.{k}"))
            if getattr(module, "moe_enabled", False):
                units.append(
                    FsdpUnit(f"mtp.{k}.block.moe.experts", block=f"mtp.{k}", kind=UnitKind.EXPERTS)
                )
        return units

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: 6 per ACTIVE non-embedding weight (a token runs top-k of
        the routed experts) plus attention scores and values (see Llama3's flops_per_token)."""
        a = self.args
        routed = sum(p.numel() for n, p in self.named_parameters() if is_expert_stack(n))
        active_routed = routed * a.n_activated_experts / a.n_routed_experts
        n_params = sum(p.numel() for p in self.parameters()) - routed + active_routed
        emb = self.tok_embeddings.weight.numel() if self.tok_embeddings is not None else 0
        # per layer and token: 2 * seq * heads * (qk + v) forward, x3 with backward; not halved
        # for the causal mask (torchtitan's and Megatron-LM's convention)
        # the MTP modules' blocks (and eh_proj, counted in n_params) run on every token too
        blocks = len(self.layers) + (len(self.mtp) if self.mtp is not None else 0)
        attn = 6.0 * blocks * seq_len * a.n_heads * (a.qk_head_dim + a.v_head_dim)
        return 6.0 * (n_params - emb) + attn

    def init_weights(self, seed: int, device) -> None:
        """Materialised (to_empty) model -> deterministic weights, zeroed MoE buffers and the
        RoPE cache. Routed-expert stacks are drawn per expert (only this rank's experts)."""
        init_parameters(
            self,
            partial(_init_fn, dim=self.args.dim, n_layers=self.args.n_layers),
            seed,
            device,
            per_expert=is_expert_stack,
        )
        for m in self.modules():
            if isinstance(m, MoE):
                m.reset_buffers()
        self.rope = yarn_rope_cache(self.args, device=device)


def _init_fn(fqn: str, dim: int, n_layers: int):
    """transformer_init_fn; MTP depth k's parameters are drawn as those of a block
    `layers.{n_layers + k}` (its depth-scaled output projections; eh_proj as any matrix).
    Each parameter's random stream still follows its own name."""
    parts = fqn.split(".")
    if parts[0] == "mtp":
        rest = parts[3:] if parts[2] == "block" else parts[2:]
        fqn = ".".join(["layers", str(n_layers + int(parts[1])), *rest])
    return transformer_init_fn(fqn, dim)
