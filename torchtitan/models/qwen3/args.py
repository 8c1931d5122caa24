"""Qwen3 shapes, dense and MoE: the published 0.6B-32B and 30B-A3B / 235B-A22B flavors and
small ones for CPU.

Torch-free so that the pre-launch checks read `model.flavor` without importing torch. The
MoE fields are named as DeepSeek-V3's (`n_routed_experts`, `n_activated_experts`, `score_func`,
`load_balance_coeff`, `aux_loss_coeff`: the [moe] keys replace them, models.protocol.MOE_OVERRIDES);
a dense flavor has n_routed_experts = 0 (`moe` is None).
"""

from dataclasses import dataclass

from torchtitan.models.protocol import AttentionShape, MoeShape


@dataclass(frozen=True)
class Qwen3Args:
    """Shape and routing hyper-parameters of a Qwen3 model (transformers' Qwen3Config /
    Qwen3MoeConfig)."""

    dim: int = 4096
    """Width of the residual stream (hidden_size)."""
    n_layers: int = 36
    """Number of transformer blocks."""
    n_heads: int = 32
    """Query heads."""
    n_kv_heads: int = 8
    """Key/value heads (grouped-query attention): each serves n_heads / n_kv_heads query heads."""
    head_dim: int = 128
    """Width of one head, independent of dim / n_heads (Qwen3 0.6B: 16 x 128 > 1024)."""
    vocab_size: int = 151936
    """Embedding rows; 0 = take the tokenizer's vocabulary size."""
    ffn_hidden_dim: int = 12288
    """Hidden width of the dense SwiGLU blocks (intermediate_size)."""
    tie_word_embeddings: bool = False
    """The output head is the input embedding (one parameter); the 0.6B, 1.7B and 4B checkpoints tie them."""
    norm_eps: float = 1e-6
    """RMSNorm epsilon (the blocks' norms and the per-head q/k norms)."""
    rope_theta: float = 1000000.0
    """RoPE base."""
    max_seq_len: int = 40960
    """Longest sequence (RoPE cache length); the trainer sets it to the training seq_len."""
    attn_backend: str = "sdpa"
    """Attention kernel (models/common/attn_backend.py): sdpa, or flex / varlen, which attend
    within documents (the block-causal mask). Upstream has no Qwen3 flex / varlen flavor."""
    # --- MoE (n_routed_experts = 0: a dense model) ---
    n_routed_experts: int = 0
    """Routed experts per MoE layer (num_experts); 0 = dense."""
    n_activated_experts: int = 8
    """Experts each token is sent to (num_experts_per_tok)."""
    moe_inter_dim: int = 768
    """Hidden width of one routed expert (moe_intermediate_size)."""
    decoder_sparse_step: int = 1
    """Block i is MoE when (i + 1) % decoder_sparse_step == 0 and i is not in mlp_only_layers."""
    mlp_only_layers: tuple[int, ...] = ()
    """Blocks kept dense whatever decoder_sparse_step says."""
    route_norm: bool = True
    """Renormalise the top-k softmax weights to sum to 1 (norm_topk_prob; published: true)."""
    score_func: str = "softmax"
    """Router affinity, float32: Qwen3 uses softmax over all experts."""
    aux_loss_coeff: float = 0.0
    """Weight of Qwen's load-balancing loss (router_aux_loss_coef; the MoE flavors: 0.001, as
    published), Switch-style over the tokens of a micro-batch and all MoE layers; 0 = off
    (models/common/moe.switch_balance_loss)."""
    load_balance_coeff: float = 0.0
    """Aux-loss-free balancing (a per-expert selection bias, as DeepSeek-V3); 0 = off."""

    # group-limited routing does not exist in Qwen3 (the shared router reads these)
    n_expert_groups: int = 1
    n_limited_groups: int = 1
    route_scale: float = 1.0

    # --- models.protocol.ModelArgs (n_layers, max_seq_len, ...: fields above)
    @property
    def n_dense_layers(self) -> int:
        # dense blocks are chosen by mlp_only_layers / decoder_sparse_step, not by a prefix
        return 0

    @property
    def attention(self) -> AttentionShape:
        return AttentionShape.gqa(self.n_heads, self.n_kv_heads, self.head_dim)

    @property
    def moe(self) -> MoeShape | None:
        """The routed experts (None: a dense flavor); balanced by Qwen's Switch-style loss."""
        if not self.n_routed_experts:
            return None
        return MoeShape(
            self.n_routed_experts,
            self.n_activated_experts,
            self.moe_inter_dim,
            0,  # no shared experts
            self.n_expert_groups,
            self.n_limited_groups,
            self.score_func,
            "switch",
            self.aux_loss_coeff,
            self.load_balance_coeff,
        )

    @property
    def mtp_depth(self) -> int | None:
        return None


# A tied flavor's output head is the embedding: the copy's name (a pipeline's last stage
# holds one) -> the parameter's name.
TIED = {"output.weight": "tok_embeddings.weight"}


def is_moe_layer(args: Qwen3Args, i: int) -> bool:
    """transformers' rule: MoE iff not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0."""
    return (
        args.moe is not None
        and i not in args.mlp_only_layers
        and (i + 1) % args.decoder_sparse_step == 0
    )


def _dense(dim, n_layers, n_heads, ffn, tie) -> Qwen3Args:
    return Qwen3Args(
        dim=dim,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=8,
        ffn_hidden_dim=ffn,
        tie_word_embeddings=tie,
    )


FLAVORS: dict[str, Qwen3Args] = {
    # CPU flavors (vocabulary from the tokenizer). debugmodel: the qwen3_debug.toml model,
    # tied like the small published ones; head_dim (32) != dim / n_heads (16).
    "debugmodel": Qwen3Args(
        dim=256,
        n_layers=6,
        n_heads=16,
        n_kv_heads=8,
        head_dim=32,
        vocab_size=0,
        ffn_hidden_dim=768,
        tie_word_embeddings=True,
    ),
    # the test-suite model: every path on tiny shapes (tied, QK-norm, head_dim != dim / heads)
    "tiny": Qwen3Args(
        dim=64,
        n_layers=4,
        n_heads=4,
        n_kv_heads=2,
        head_dim=32,
        vocab_size=0,
        ffn_hidden_dim=192,
        tie_word_embeddings=True,
    ),
    "tiny_untied": Qwen3Args(
        dim=64, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=32, vocab_size=0, ffn_hidden_dim=192
    ),
    # MoE on CPU: the qwen3_moe_debug.toml model; block 0 dense (mlp_only_layers), 8 experts, top-2
    "debugmodel_moe": Qwen3Args(
        dim=256,
        n_layers=6,
        n_heads=16,
        n_kv_heads=4,
        head_dim=32,
        vocab_size=0,
        ffn_hidden_dim=768,
        n_routed_experts=8,
        n_activated_experts=2,
        moe_inter_dim=128,
        mlp_only_layers=(0,),
        aux_loss_coeff=0.001,
    ),
    "tiny_moe": Qwen3Args(
        dim=64,
        n_layers=4,
        n_heads=4,
        n_kv_heads=2,
        head_dim=32,
        vocab_size=0,
        ffn_hidden_dim=192,
        n_routed_experts=8,
        n_activated_experts=2,
        moe_inter_dim=32,
        mlp_only_layers=(0,),
        aux_loss_coeff=0.001,
    ),
    # the published Qwen3 dense checkpoints (config.json on the hub)
    "0.6B": Qwen3Args(
        dim=1024,
        n_layers=28,
        n_heads=16,
        n_kv_heads=8,
        ffn_hidden_dim=3072,
        tie_word_embeddings=True,
    ),
    "1.7B": _dense(2048, 28, 16, 6144, True),
    "4B": _dense(2560, 36, 32, 9728, True),
    "8B": _dense(4096, 36, 32, 12288, False),
    "14B": _dense(5120, 40, 40, 17408, False),
    "32B": _dense(5120, 64, 64, 25600, False),
    # the published MoE checkpoints: 128 experts, top-8, every block MoE, 4 KV heads
    "30B-A3B": Qwen3Args(
        dim=2048,
        n_layers=48,
        n_heads=32,
        n_kv_heads=4,
        ffn_hidden_dim=6144,
        n_routed_experts=128,
        n_activated_experts=8,
        moe_inter_dim=768,
        aux_loss_coeff=0.001,
    ),
    "235B-A22B": Qwen3Args(
        dim=4096,
        n_layers=94,
        n_heads=64,
        n_kv_heads=4,
        ffn_hidden_dim=12288,
        n_routed_experts=128,
        n_activated_experts=8,
        moe_inter_dim=1536,
        aux_loss_coeff=0.001,
    ),
}
