"""What the build path needs of a registered model to build and parallelize it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch import nn

from torchtitan.models.registry import MODELS, model_entry

if TYPE_CHECKING:
    from torchtitan.config.job_config import Compile, Parallelism
    from torchtitan.distributed.data_parallel import Precision
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.plan import PartPlan

# (model part on meta, dims, the part's plan, [parallelism], [compile], precision) -> the part
ParallelizeFn = Callable[
    [nn.Module, "ParallelDims", "PartPlan", "Parallelism", "Compile", "Precision"], nn.Module
]


@dataclass(frozen=True)
class TrainSpec:
    name: str
    model_cls: type[nn.Module]  # implements models.protocol.TrainableModel
    flavors: dict
    # TP -> AC -> compile -> data parallel on one model part, as its plan says
    parallelize_fn: ParallelizeFn
    # Substrings of parameter names TP leaves whole (the rest of the matrices it splits)
    tp_replicated: tuple[str, ...] = ()


def get_train_spec(name: str) -> TrainSpec:
    """The TRAIN_SPEC of a registered model's parallelize module (imports torch and the model)."""
    if name not in MODELS:
        raise ValueError(
            f"--model.name: no train spec for '{name}'; registered: {', '.join(MODELS)}"
        )
    return model_entry(name).module("parallelize").TRAIN_SPEC
