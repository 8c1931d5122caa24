"""DeepSeek-V3 shapes: the published 16B (V2-Lite / Moonlight layout) and 671B (V3 report)
flavors and small ones for tests.

Torch-free so that the pre-launch checks read `model.flavor` without importing torch.
"""

from dataclasses import dataclass, replace

from torchtitan.models.protocol import AttentionShape, MoeShape


@dataclass(frozen=True)
class DeepSeekV3Args:
    """Shape and routing hyper-parameters of a DeepSeek-V3 style model (MLA + DeepSeekMoE)."""

    dim: int = 7168
    """Width of the residual stream."""
    n_layers: int = 61
    """Number of transformer blocks."""
    n_dense_layers: int = 3
    """The first `n_dense_layers` blocks use a dense SwiGLU FFN, the rest a MoE layer."""
    n_heads: int = 128
    """Attention heads (MLA has no grouped KV heads: every head has its own keys/values)."""
    vocab_size: int = 129280
    """Embedding rows; 0 = take the tokenizer's vocabulary size."""
    inter_dim: int = 18432
    """Hidden width of the dense FFN blocks."""
    moe_inter_dim: int = 2048
    """Hidden width of one routed (and one shared) expert."""
    n_routed_experts: int = 256
    """Routed experts per MoE layer."""
    n_shared_experts: int = 1
    """Always-active experts per MoE layer, fused into one FFN of n_shared * moe_inter_dim."""
    n_activated_experts: int = 8
    """Routed experts each token is sent to (top-k)."""
    n_expert_groups: int = 8
    """Routed experts are split into this many equal groups for group-limited routing."""
    n_limited_groups: int = 4
    """A token may only pick experts in its best `n_limited_groups` groups."""
    score_func: str = "sigmoid"
    """Router affinity: "softmax" (V2) or "sigmoid" (V3), computed in float32."""
    route_norm: bool = True
    """Normalise the selected experts' weights to sum to 1 (before `route_scale`)."""
    route_scale: float = 2.5
    """Multiplier on the routing weights."""
    load_balance_coeff: float = 1e-3
    """Aux-loss-free balancing: bias update speed (gamma in the V3 report); 0 disables it."""
    aux_loss_coeff: float = 0.0
    """Sequence-wise balance loss weight (alpha in the V3 report, which used 1e-4); 0 = off."""
    q_lora_rank: int = 1536
    """Low-rank query compression width; 0 = one plain `wq` projection."""
    kv_lora_rank: int = 512
    """Width of the compressed joint key/value latent (what an inference KV cache stores)."""
    qk_nope_head_dim: int = 128
    """Per-head query/key width without positional rotation."""
    qk_rope_head_dim: int = 64
    """Per-head query width with RoPE; the rotated key part is shared by all heads."""
    v_head_dim: int = 128
    """Per-head value width."""
    norm_eps: float = 1e-6
    """RMSNorm epsilon."""
    rope_theta: float = 10000.0
    """RoPE base."""
    rope_factor: float = 40.0
    """YaRN context-extension factor."""
    original_seq_len: int = 4096
    """Pre-training context; YaRN (frequencies and attention scale) applies beyond it."""
    beta_fast: int = 32
    """YaRN: frequencies with more than `beta_fast` rotations over the original context are kept."""
    beta_slow: int = 1
    """YaRN: frequencies with fewer than `beta_slow` rotations are divided by `rope_factor`."""
    mscale: float = 1.0
    """YaRN attention-temperature coefficient (softmax scale *= (0.1*mscale*ln(factor)+1)^2)."""
    yarn: str = "beyond_original"
    """When YaRN applies: "beyond_original" (the reference implementation's rule: only when
    max_seq_len > original_seq_len), "always" (transformers' rule for a folder whose rope type
    is yarn, at every length) or "never" (plain RoPE). A Hugging Face import sets it from the
    folder, so the model computes what the folder's model computes at every seq_len."""
    yarn_temperature: str = "softmax"
    """Where YaRN's attention-temperature correction goes when YaRN applies: "softmax" (the
    softmax scale *= (0.1*mscale*ln(factor)+1)^2; DeepSeek's rule, and transformers' with
    mscale_all_dim = mscale) or "rope" (transformers' rule for a folder without
    mscale_all_dim: cos/sin are multiplied by 0.1*ln(factor)+1, the softmax scale stays)."""
    max_seq_len: int = 163840
    """Longest sequence (RoPE cache length); the trainer sets it to the training seq_len."""
    mtp_depth: int = 0
    """Multi-token-prediction modules after the last block (`model.mtp_depth`; 0 = none, the
    V3 report used 1): module k (0-based) predicts token t+2+k at position t from the previous
    hidden state and the embedding of token t+1+k, with one more transformer block."""
    attn_backend: str = "sdpa"
    """Attention kernel (models/common/attn_backend.py): sdpa, or flex / varlen, which attend
    within documents (the block-causal mask)."""

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def n_kv_heads(self) -> int:
        # MLA expands the latent into one key/value per head
        return self.n_heads

    # --- models.protocol.ModelArgs (n_layers, n_dense_layers, mtp_depth: fields above)
    @property
    def attention(self) -> AttentionShape:
        # a block keeps the compressed key/value latent and the shared rotated key per token
        return AttentionShape(
            self.n_heads,
            self.n_kv_heads,
            self.qk_head_dim,
            self.v_head_dim,
            self.kv_lora_rank + self.qk_rope_head_dim,
        )

    @property
    def moe(self) -> MoeShape | None:
        if not self.n_routed_experts:
            return None
        return MoeShape(
            self.n_routed_experts,
            self.n_activated_experts,
            self.moe_inter_dim,
            self.n_shared_experts,
            self.n_expert_groups,
            self.n_limited_groups,
            self.score_func,
            "sequence",
            self.aux_loss_coeff,
            self.load_balance_coeff,
        )


YARN_RULES = ("beyond_original", "always", "never")
YARN_TEMPERATURES = ("softmax", "rope")


def yarn_on(args: DeepSeekV3Args) -> bool:
    """Whether YaRN (frequencies and attention temperature) applies to a model of these args."""
    if args.yarn == "beyond_original":
        return args.max_seq_len > args.original_seq_len
    return args.yarn == "always"


def yarn_mscale(args: DeepSeekV3Args, coefficient: float) -> float:
    """YaRN's attention-temperature factor 0.1*coefficient*ln(factor)+1 (1 for factor <= 1)."""
    import math

    return 0.1 * coefficient * math.log(args.rope_factor) + 1.0 if args.rope_factor > 1 else 1.0


# The `make train` MoE model: V3-style routing (sigmoid, bias balancing, normalised
# weights), no group limit, plain wq. 13,604,864 parameters + 2 * 256 * vocab
# (14,653,440 with the 2K tokenizer); 9.2M non-embedding ones active per token.
_DEBUG = DeepSeekV3Args(
    dim=256,
    n_layers=6,
    n_dense_layers=1,
    n_heads=16,
    vocab_size=0,
    inter_dim=1024,
    moe_inter_dim=256,
    n_routed_experts=8,
    n_shared_experts=2,
    n_activated_experts=3,
    n_expert_groups=1,
    n_limited_groups=1,
    score_func="sigmoid",
    route_norm=True,
    route_scale=1.0,
    q_lora_rank=0,
    kv_lora_rank=128,
    qk_nope_head_dim=32,
    qk_rope_head_dim=16,
    v_head_dim=32,
    max_seq_len=2048,
)

FLAVORS: dict[str, DeepSeekV3Args] = {
    "debugmodel": _DEBUG,
    # upstream's debugmodel_flex_attn: the same shapes, attending within documents
    "debugmodel_flex_attn": replace(_DEBUG, attn_backend="flex"),
    # The test-suite model: every code path on tiny shapes. Group-limited routing is active
    # (2 groups of 4, 1 kept); v_head_dim != qk_head_dim; original_seq_len is 64 so that
    # YaRN is active at the usual test seq_len (128). 272,576 parameters + 2 * 64 * vocab
    # (534,720 with the 2K tokenizer).
    "tiny": DeepSeekV3Args(
        dim=64,
        n_layers=4,
        n_dense_layers=1,
        n_heads=4,
        vocab_size=0,
        inter_dim=192,
        moe_inter_dim=32,
        n_routed_experts=8,
        n_shared_experts=1,
        n_activated_experts=2,
        n_expert_groups=2,
        n_limited_groups=1,
        score_func="sigmoid",
        route_norm=True,
        route_scale=1.0,
        q_lora_rank=0,
        kv_lora_rank=32,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=16,
        rope_factor=4.0,
        original_seq_len=64,
        max_seq_len=512,
    ),
    # DeepSeek-V2-Lite's published shape (also Moonlight's): 15.71B parameters, ~2.7B active.
    "16B": DeepSeekV3Args(
        dim=2048,
        n_layers=27,
        n_dense_layers=1,
        n_heads=16,
        vocab_size=102400,
        inter_dim=10944,
        moe_inter_dim=1408,
        n_routed_experts=64,
        n_shared_experts=2,
        n_activated_experts=6,
        n_expert_groups=1,
        n_limited_groups=1,
        score_func="softmax",
        route_norm=False,
        route_scale=1.0,
        q_lora_rank=0,
        kv_lora_rank=512,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        mscale=0.707,
    ),
    # The DeepSeek-V3 technical report (without the multi-token-prediction module):
    # 671.03B parameters, ~37.6B active per token.
    "671B": DeepSeekV3Args(
        dim=7168,
        n_layers=61,
        n_dense_layers=3,
        n_heads=128,
        vocab_size=129280,
        inter_dim=18432,
        moe_inter_dim=2048,
        n_routed_experts=256,
        n_shared_experts=1,
        n_activated_experts=8,
        n_expert_groups=8,
        n_limited_groups=4,
        score_func="sigmoid",
        route_norm=True,
        route_scale=2.5,
        load_balance_coeff=1e-3,  # the report also adds a sequence-wise loss of 1e-4: opt in
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        rope_theta=10000.0,
        rope_factor=40.0,
        original_seq_len=4096,
        beta_fast=32,
        beta_slow=1,
        mscale=1.0,
    ),
}
