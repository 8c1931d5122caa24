"""Which attention kernel a flavor asks for, and the mask it implies. Torch-free: the
pre-launch checks and the build path read it before torch is imported.

- `sdpa`: torch's scaled_dot_product_attention under the job's `model.attn_mask`.
- `flex`: FlexAttention with a document-causal BlockMask (upstream's `*_flex_attn` flavors).
- `varlen`: `torch.nn.attention.varlen_attn` over the packed window, one sequence per
  document (upstream's `*_varlen_attn` flavors).

flex and varlen exist to attend within documents, so their flavors imply the block-causal
mask; a run that asks for `causal` with one is refused. Where their kernels cannot train
(CPU in torch 2.13, or under context parallel) the same document-causal attention runs
through SDPA (models/common/attention.py says why, once per run).
"""

ATTN_BACKENDS = ("sdpa", "flex", "varlen")
DOCUMENT_BACKENDS = ("flex", "varlen")  # the backends that imply block_causal


def attn_backend_of(args) -> str:
    """The backend a model's args ask for; sdpa for args without the field (a user model)."""
    return getattr(args, "attn_backend", "sdpa")


def implied_attn_mask(args) -> str | None:
    """block_causal for a flex / varlen flavor, None when the job's model.attn_mask decides."""
    return "block_causal" if attn_backend_of(args) in DOCUMENT_BACKENDS else None


def run_attn_mask(attn_mask: str, args) -> str:
    """The mask a run computes: `model.attn_mask` as given, or for "auto" the flavor's
    (block_causal for flex / varlen, else causal). The check refuses causal with a flex /
    varlen flavor before this is asked."""
    if attn_mask == "auto":
        return implied_attn_mask(args) or "causal"
    return attn_mask
