"""Registry lookup: model name -> what the trainer needs to build and parallelize it."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from torch import nn

from torchtitan.models.flavors import model_args  # noqa: F401 (re-exported)
from torchtitan.models.registry import MODELS

if TYPE_CHECKING:
    from torchtitan.config.job_config import JobConfig
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.plan import PartPlan

ParallelizeFn = Callable[[nn.Module, "ParallelDims", "JobConfig", "PartPlan", str], nn.Module]


@dataclass(frozen=True)
class TrainSpec:
    name: str
    model_cls: type[nn.Module]  # implements protocols.model.TrainableModel
    flavors: dict
    # (model part on meta, dims, config, the part's plan, param dtype) -> the parallelized part
    parallelize_fn: ParallelizeFn
    # Substrings of parameter names TP leaves whole (the rest of the matrices it splits)
    tp_replicated: tuple[str, ...] = ()


def get_train_spec(name: str) -> TrainSpec:
    if name not in MODELS:
        raise ValueError(f"--model.name: no train spec for '{name}'; registered: {', '.join(MODELS)}")
    return importlib.import_module(MODELS[name].package + ".parallelize").TRAIN_SPEC
