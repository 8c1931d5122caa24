"""The contract between a model and the framework: what the shared build path (pipeline
split, FSDP units, reshard plan, weight init, MFU) reads of a model, and nothing else.

Blocks are the unit every policy speaks of: they live in `model.layers`, an nn.ModuleDict
keyed by global block index ("0".."n-1"), so their names are `layers.<i>` in every layout
(a pipeline stage deletes the blocks it does not hold and keeps the others' names).
"""

from typing import ClassVar, Protocol, runtime_checkable

import torch
from torch import nn

from torchtitan.distributed.plan import BLOCKS, FsdpUnit  # noqa: F401 (BLOCKS: the blocks' attribute)


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
