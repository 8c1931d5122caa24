"""Registry: model name -> what the trainer needs to build and parallelize it."""

import dataclasses
from dataclasses import dataclass
from typing import Callable

from torch import nn

from torchtitan.models.flavors import MODEL_FLAVORS


@dataclass(frozen=True)
class TrainSpec:
    name: str
    model_cls: type[nn.Module]
    flavors: dict
    parallelize_fn: Callable  # (model part, parallel_dims, job_config, param_dtype, reshard plan) -> part
    pipeline_fn: Callable  # (whole model on meta, PipelineLayout, pp_rank) -> [(stage id, part)]
    fsdp_units_fn: Callable  # (model part, tp degree, param dtype bytes) -> [reshard_policy.Unit]


def _llama3() -> TrainSpec:
    from torchtitan.models.llama3.model import Transformer
    from torchtitan.models.llama3.parallelize import fsdp_units, parallelize_llama
    from torchtitan.models.llama3.pipeline import pipeline_llama

    return TrainSpec("llama3", Transformer, MODEL_FLAVORS["llama3"], parallelize_llama, pipeline_llama, fsdp_units)


_REGISTRY: dict[str, Callable[[], TrainSpec]] = {"llama3": _llama3}


def get_train_spec(name: str) -> TrainSpec:
    if name not in _REGISTRY:
        raise ValueError(f"--model.name: no train spec for '{name}'; registered: {', '.join(_REGISTRY)}")
    return _REGISTRY[name]()


def model_args(name: str, flavor: str, vocab_size: int, seq_len: int):
    """The flavor's args with the tokenizer's vocabulary (when the flavor leaves it open)
    and a RoPE cache just long enough for training."""
    args = MODEL_FLAVORS[name][flavor]
    if args.vocab_size and args.vocab_size < vocab_size:
        raise ValueError(
            f"--model.tokenizer_path: tokenizer has {vocab_size} tokens but {name} {flavor} has only"
            f" {args.vocab_size} embeddings; use a matching tokenizer"
        )
    return dataclasses.replace(args, vocab_size=args.vocab_size or vocab_size, max_seq_len=seq_len)
