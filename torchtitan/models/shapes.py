"""Every parameter of a model with its full shape and how the layout splits it, torch-free.

Each model declares its own in `<package>/shapes.py` (`shapes(args) -> ModelShapes`), beside
its model.py; the pre-launch model-states check (memory/model_states.py) reads them through
the registry, and tests/unit/test_model_states.py compares every registered model's shapes
with the model built on meta, parameter by parameter, and with its parallelized build.

How a parameter is split follows the build path:
- tensor parallel splits the dim the model's TP plan names, as torch's ColwiseParallel /
  RowwiseParallel do (a Linear's [out, in]: column-wise dim 0, row-wise dim 1; the row-wise
  embeddings: the vocabulary, dim 0), and replicates norms and what the plan keeps whole;
- routed experts ([E, ...] stacks) are split over expert parallel on dim 0, never over TP.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torchtitan.distributed.plan import BLOCKS

COLWISE, ROWWISE = 0, 1  # the weight dim TP splits: Linear [out, in] column-wise / row-wise
EMBEDDING_ROWWISE = 0  # RowwiseParallel on nn.Embedding [vocab, dim] splits the vocabulary


@dataclass(frozen=True)
class Param:
    """One parameter: its full shape and how the layout splits it."""

    name: str  # as model.named_parameters() calls it
    shape: tuple[int, ...]
    tp_dim: int | None = None  # the dim tensor parallel splits; None: replicated over TP
    expert: bool = False  # a routed-expert stack: expert parallel splits dim 0
    linear: bool = False  # the weight of an nn.Linear (what float8 training converts)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class ModelShapes:
    """A model's parameters grouped by what a pipeline stage keeps or drops as a whole."""

    first: list[Param]  # only on the first pipeline stage (embeddings)
    blocks: list[list[Param]]  # block i's parameters (named f"{BLOCKS}.{i}.")
    last: list[Param]  # only on the last stage (final norm, output)
    # Names in `last` of tied copies (an output head that IS the embedding): a part holding
    # the first stage too has one parameter for both, a last stage alone holds the copy.
    tied: tuple[str, ...] = ()

    def all(self) -> list[Param]:
        return self.stage(tuple(range(len(self.blocks))), True, True)

    def stage(self, blocks: tuple[int, ...], first: bool, last: bool) -> list[Param]:
        tail = [p for p in self.last if not (first and p.name in self.tied)] if last else []
        return (self.first if first else []) + [p for i in blocks for p in self.blocks[i]] + tail


def linear(name: str, out_dim: int, in_dim: int, tp_dim: int | None) -> Param:
    return Param(f"{name}.weight", (out_dim, in_dim), tp_dim, linear=True)


def norm(name: str, dim: int) -> Param:
    return Param(f"{name}.weight", (dim,))  # TP: sequence parallel or replicated, never split


def swiglu(name: str, dim: int, hidden: int) -> list[Param]:
    """common.feed_forward.FeedForward under common.tensor_parallel.feed_forward_sharding."""
    return [
        linear(f"{name}.w1", hidden, dim, COLWISE),
        linear(f"{name}.w2", dim, hidden, ROWWISE),
        linear(f"{name}.w3", hidden, dim, COLWISE),
    ]


def decoder_ends(args) -> tuple[list[Param], list[Param]]:
    """Embeddings (first stage) and final norm + output (last stage), per common.tensor_parallel.
    root_sharding: embeddings row-wise, output column-wise."""
    first = [Param("tok_embeddings.weight", (args.vocab_size, args.dim), EMBEDDING_ROWWISE)]
    last = [norm("norm", args.dim), linear("output", args.vocab_size, args.dim, COLWISE)]
    return first, last


def block_name(i: int) -> str:
    return f"{BLOCKS}.{i}"
