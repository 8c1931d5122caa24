"""Registry: model name -> what the trainer needs to build and parallelize it."""

from dataclasses import dataclass
from typing import Callable

from torch import nn

from torchtitan.models.flavors import MODEL_FLAVORS, model_args  # noqa: F401 (model_args: re-exported)


@dataclass(frozen=True)
class TrainSpec:
    name: str
    model_cls: type[nn.Module]
    flavors: dict
    parallelize_fn: Callable  # (model part, parallel_dims, job_config, param_dtype, reshard plan) -> part
    pipeline_fn: Callable  # (whole model on meta, PipelineLayout, pp_rank) -> [(stage id, part)]
    fsdp_units_fn: Callable  # (model part, ParallelDims, param dtype bytes) -> [reshard_policy.Unit]


def _llama3() -> TrainSpec:
    from torchtitan.models.llama3.model import Transformer
    from torchtitan.models.llama3.parallelize import fsdp_units, parallelize_llama
    from torchtitan.models.llama3.pipeline import pipeline_llama

    return TrainSpec("llama3", Transformer, MODEL_FLAVORS["llama3"], parallelize_llama, pipeline_llama, fsdp_units)


def _deepseek_v3() -> TrainSpec:
    from torchtitan.models.deepseek_v3.model import Transformer
    from torchtitan.models.deepseek_v3.parallelize import fsdp_units, parallelize_deepseekv3
    from torchtitan.models.deepseek_v3.pipeline import pipeline_deepseekv3

    return TrainSpec("deepseek_v3", Transformer, MODEL_FLAVORS["deepseek_v3"], parallelize_deepseekv3,
                     pipeline_deepseekv3, fsdp_units)


_REGISTRY: dict[str, Callable[[], TrainSpec]] = {"llama3": _llama3, "deepseek_v3": _deepseek_v3}


def get_train_spec(name: str) -> TrainSpec:
    if name not in _REGISTRY:
        raise ValueError(f"--model.name: no train spec for '{name}'; registered: {', '.join(_REGISTRY)}")
    return _REGISTRY[name]()
