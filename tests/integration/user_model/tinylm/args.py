"""The model's shapes: an args dataclass and its flavors (torch-free)."""

from dataclasses import dataclass


@dataclass(frozen=True)
class TinyArgs:
    dim: int = 64
    n_layers: int = 2
    hidden: int = 128
    vocab_size: int = 0  # 0: the tokenizer's
    max_seq_len: int = 2048  # the trainer sets it to the training seq_len
    norm_eps: float = 1e-5


FLAVORS = {"small": TinyArgs(), "deeper": TinyArgs(n_layers=4)}
