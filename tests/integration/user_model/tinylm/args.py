"""The model's shapes: an args dataclass and its flavors (torch-free)."""

from dataclasses import dataclass

from torchtitan.models.protocol import AttentionShape, MoeShape


@dataclass(frozen=True)
class TinyArgs:
    dim: int = 64
    n_layers: int = 2
    hidden: int = 128
    vocab_size: int = 0  # 0: the tokenizer's
    max_seq_len: int = 2048  # the trainer sets it to the training seq_len
    norm_eps: float = 1e-5

    # What the framework reads of every model's args (torchtitan.models.protocol.ModelArgs):
    # tinylm's blocks are MLPs, all alike: no attention, no experts, no multi-token prediction.
    @property
    def n_dense_layers(self) -> int:
        return 0

    @property
    def attention(self) -> AttentionShape | None:
        return None

    @property
    def moe(self) -> MoeShape | None:
        return None

    @property
    def mtp_depth(self) -> int | None:
        return None


FLAVORS = {"small": TinyArgs(), "deeper": TinyArgs(n_layers=4)}
