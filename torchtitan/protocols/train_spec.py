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


def model_args(name: str, flavor: str, vocab_size: int, seq_len: int, moe=None):
    """The flavor's args with the tokenizer's vocabulary (when the flavor leaves it open),
    a RoPE cache just long enough for training and the [moe] overrides (`moe`: JobConfig.moe)."""
    args = MODEL_FLAVORS[name][flavor]
    if moe is not None and getattr(args, "n_routed_experts", 0):
        overrides = {"n_activated_experts": moe.top_k or None,
                     "score_func": None if moe.score_func == "flavor" else moe.score_func,
                     "load_balance_coeff": None if moe.load_balance_coeff == -1 else moe.load_balance_coeff,
                     "aux_loss_coeff": None if moe.aux_loss_coeff == -1 else moe.aux_loss_coeff}
        args = dataclasses.replace(args, **{k: v for k, v in overrides.items() if v is not None})
    if args.vocab_size and args.vocab_size < vocab_size:
        raise ValueError(
            f"--model.tokenizer_path: tokenizer has {vocab_size} tokens but {name} {flavor} has only"
            f" {args.vocab_size} embeddings; use a matching tokenizer"
        )
    return dataclasses.replace(args, vocab_size=args.vocab_size or vocab_size, max_seq_len=seq_len)
