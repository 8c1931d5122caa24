"""Llama3 shapes: the published Llama 3.2 1B / 3B and 3.1 8B / 70B / 405B flavors and small ones for tests.

Torch-free so that the pre-launch checks read `model.flavor` without importing torch.
"""

from dataclasses import dataclass, replace

from torchtitan.models.protocol import AttentionShape, MoeShape


@dataclass(frozen=True)
class Llama3Args:
    dim: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    n_kv_heads: int = 8
    vocab_size: int = 128256  # 0 = take the tokenizer's vocabulary size
    multiple_of: int = 1024  # FFN hidden size is rounded up to a multiple of this
    ffn_dim_multiplier: float | None = 1.3
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    rope_scaling: bool = True  # Llama-3.1 long-context frequency scaling
    rope_factor: float = 8.0  # its factor: 8 for Llama 3.1, 32 for Llama 3.2
    max_seq_len: int = 131072
    attn_backend: str = "sdpa"
    """Attention kernel (models/common/attn_backend.py): sdpa, or flex / varlen, which attend
    within documents (the block-causal mask)."""

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def ffn_hidden_dim(self) -> int:
        hidden = int(2 * 4 * self.dim / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return self.multiple_of * ((hidden + self.multiple_of - 1) // self.multiple_of)

    # --- models.protocol.ModelArgs: dense GQA decoder, no experts, no MTP
    @property
    def n_dense_layers(self) -> int:
        return 0  # every block is dense: no MoE blocks follow

    @property
    def attention(self) -> AttentionShape:
        return AttentionShape.gqa(self.n_heads, self.n_kv_heads, self.head_dim)

    @property
    def moe(self) -> MoeShape | None:
        return None

    @property
    def mtp_depth(self) -> int | None:
        return None


# ~6M parameters with the bundled 2K tokenizer: the `make train` model.
_DEBUG = Llama3Args(
    dim=256,
    n_layers=6,
    n_heads=16,
    n_kv_heads=8,
    vocab_size=0,
    multiple_of=256,
    ffn_dim_multiplier=None,
    rope_theta=500000.0,
)
_8B = Llama3Args(
    dim=4096,
    n_layers=32,
    n_heads=32,
    n_kv_heads=8,
    multiple_of=1024,
    ffn_dim_multiplier=1.3,
)

FLAVORS: dict[str, Llama3Args] = {
    "debugmodel": _DEBUG,
    # upstream's attention-kernel flavors: the same shapes, attending within documents
    "debugmodel_flex_attn": replace(_DEBUG, attn_backend="flex"),
    "debugmodel_varlen_attn": replace(_DEBUG, attn_backend="varlen"),
    # ~0.4M parameters: the integration-test model (many runs, 2 cores).
    "tiny": Llama3Args(
        dim=64,
        n_layers=4,
        n_heads=8,
        n_kv_heads=4,
        vocab_size=0,
        multiple_of=64,
        ffn_dim_multiplier=None,
    ),
    # Llama 3.2 (published shapes; Hugging Face ties their output layer to the embedding,
    # ours is a separate parameter started from the embedding when loaded from there).
    "1B": Llama3Args(
        dim=2048,
        n_layers=16,
        n_heads=32,
        n_kv_heads=8,
        multiple_of=256,
        ffn_dim_multiplier=1.5,
        rope_factor=32.0,
    ),
    "3B": Llama3Args(
        dim=3072,
        n_layers=28,
        n_heads=24,
        n_kv_heads=8,
        multiple_of=256,
        ffn_dim_multiplier=1.0,
        rope_factor=32.0,
    ),
    "8B": _8B,
    "8B_flex": replace(_8B, attn_backend="flex"),
    "8B_varlen": replace(_8B, attn_backend="varlen"),
    "70B": Llama3Args(
        dim=8192,
        n_layers=80,
        n_heads=64,
        n_kv_heads=8,
        multiple_of=4096,
        ffn_dim_multiplier=1.3,
    ),
    "405B": Llama3Args(
        dim=16384,
        n_layers=126,
        n_heads=128,
        n_kv_heads=8,
        multiple_of=4096,
        ffn_dim_multiplier=1.2,
    ),
}
