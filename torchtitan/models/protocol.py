"""The contract between a model and the framework: what the shared code reads of a model
(`TrainableModel`: pipeline split, FSDP units, reshard plan, weight init, MFU) and of its args
(`ModelArgs`: the checks, the planner, the trainer), and nothing else. Outside models/ the
framework reads model args through these members only, never probing a field by name;
tests/unit/test_model_contract.py and test_model_args_contract.py hold every registered model
to them.

Blocks are the unit every policy speaks of: they live in `model.layers`, an nn.ModuleDict
keyed by global block index ("0".."n-1"), so their names are `layers.<i>` in every layout
(a pipeline stage deletes the blocks it does not hold and keeps the others' names).

Torch-free (torch only for annotations): args.py modules import the shapes below, and the
pre-launch checks import args.py before torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol, runtime_checkable

from torchtitan.distributed.plan import BLOCKS, FsdpUnit  # noqa: F401 (BLOCKS: the blocks' attribute)

if TYPE_CHECKING:
    import torch
    from torch import nn


@runtime_checkable
class TrainableModel(Protocol):
    # Modules only the first / last pipeline stage keeps (set to None on the others, whose
    # forward then passes hidden states through): e.g. ("tok_embeddings",), ("norm", "output").
    # An optional feature's module may be None when the model is built without it (DeepSeek-V3's
    # "mtp" with mtp_depth=0).
    first_stage_modules: ClassVar[tuple[str, ...]]
    last_stage_modules: ClassVar[tuple[str, ...]]
    layers: nn.ModuleDict

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token ids [B, S] -> logits [B, S, vocab] (hidden states on non-last stages)."""

    def fsdp_units(self) -> list[FsdpUnit]:
        """FSDP units in forward order: name, block, kind (e.g. routed experts). The root (what
        no unit owns) is added by the framework."""

    def init_weights(self, seed: int, device: torch.device) -> None:
        """Fill the materialised (to_empty) parameters and buffers, the same in every layout."""

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token (forward + backward), for MFU."""


# ------------------------------------------------------------------ the args


@dataclass(frozen=True)
class AttentionShape:
    """A block's attention as the checks (TP divides the heads) and the planner's cost
    estimate (FLOPs, context parallel's K/V gathers) see it."""

    n_heads: int  # query heads
    n_kv_heads: int  # key/value heads (grouped-query attention: fewer than n_heads)
    qk_head_dim: int  # width of one head's query and key
    v_head_dim: int  # width of one head's value
    kv_width: int  # elements per token of the keys and values one block keeps (CP gathers them)

    @classmethod
    def gqa(cls, n_heads: int, n_kv_heads: int, head_dim: int) -> AttentionShape:
        """Grouped-query attention: one head width, a key and a value per KV head."""
        return cls(n_heads, n_kv_heads, head_dim, head_dim, 2 * n_kv_heads * head_dim)


AUX_LOSS_KINDS = ("sequence", "switch")  # DeepSeek-V3's sequence-wise loss, Qwen's Switch-style


@dataclass(frozen=True)
class MoeShape:
    """The routed experts of a model's MoE blocks and how tokens are balanced over them."""

    n_routed_experts: int  # per MoE block (> 0)
    n_activated_experts: int  # top-k: routed experts per token
    moe_inter_dim: int  # hidden width of one routed expert
    n_shared_experts: int  # always-active experts per MoE block (0: none)
    n_expert_groups: int  # group-limited routing: experts split into this many groups ...
    n_limited_groups: int  # ... of which a token reaches the best n_limited_groups (1, 1: off)
    score_func: str  # router affinity: "softmax" or "sigmoid"
    aux_loss_kind: str  # which balance loss aux_loss_coeff weighs (AUX_LOSS_KINDS)
    aux_loss_coeff: float  # 0: no balance loss
    load_balance_coeff: float  # aux-loss-free bias balancing speed; 0: off


# The [moe] keys (config.job_config.Moe) -> the args field each replaces (flavors.model_args):
# a model with experts keeps these as dataclass fields, which its `moe` reflects.
MOE_OVERRIDES = {
    "top_k": "n_activated_experts",
    "score_func": "score_func",
    "load_balance_coeff": "load_balance_coeff",
    "aux_loss_coeff": "aux_loss_coeff",
}
# Fields the framework replaces (dataclasses.replace) in every model's args: the tokenizer's
# vocabulary, the training length, the memory planner's reduced block counts.
REPLACED_FIELDS = ("n_layers", "vocab_size", "max_seq_len")


@runtime_checkable
class ModelArgs(Protocol):
    """What the framework reads of a model's args: a frozen dataclass (changed with
    dataclasses.replace) whose class provides these, as fields or properties. Every model's
    args implement them all; a model without attention, experts or MTP says so (None)."""

    @property
    def dim(self) -> int:
        """Width of the residual stream."""

    @property
    def n_layers(self) -> int:
        """Number of blocks (a field: the planner simulates fewer)."""

    @property
    def n_dense_layers(self) -> int:
        """Leading blocks with a dense FFN before the MoE blocks (DeepSeek-V3's prefix; a field
        when > 0: the planner replaces it with n_layers); 0 when the blocks are alike or their
        kinds are not a prefix (Qwen3's mlp_only_layers)."""

    @property
    def vocab_size(self) -> int:
        """Embedding rows; 0 = the tokenizer's (a field: the framework fills it in)."""

    @property
    def max_seq_len(self) -> int:
        """Longest sequence (a field: the trainer sets it to the training seq_len)."""

    @property
    def attention(self) -> AttentionShape | None:
        """The blocks' attention; None for a model without any."""

    @property
    def moe(self) -> MoeShape | None:
        """The routed experts; None for a dense model (then the [moe] keys and EP are refused)."""

    @property
    def mtp_depth(self) -> int | None:
        """Multi-token-prediction modules (a field: --model.mtp_depth sets it); None for a
        model without multi-token prediction."""


# the members above, in order
CONTRACT_MEMBERS = tuple(n for n, v in vars(ModelArgs).items() if isinstance(v, property))


def contract_gaps(args) -> list[str]:
    """The ModelArgs members `args` lacks (empty when it keeps the contract)."""
    return [m for m in CONTRACT_MEMBERS if not hasattr(args, m)]
