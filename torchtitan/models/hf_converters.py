"""Model name -> its Hugging Face weight converter module (torch-free import).

A converter module provides: hf_name(fqn), to_hf(fqn, tensor, args), from_hf(fqn, tensor,
args), hf_shapes(args), hf_config(args, dtype, bos_id, eos_id), config_mismatches(config,
args), TIED_FALLBACK (Hugging Face names that a tied model stores under another name) and
IGNORED (a regex of stored tensors that are not weights).
"""

import importlib

from torchtitan.models.registry import MODELS

_CONVERTERS = {name: entry.hf_converter for name, entry in MODELS.items() if entry.hf_converter}


def hf_converter(model_name: str):
    """The converter module of `model_name`; ValueError if the model has none yet."""
    if model_name not in _CONVERTERS:
        raise ValueError(
            f"model {model_name} has no Hugging Face weight converter yet (models with one:"
            f" {', '.join(_CONVERTERS)}); start from a checkpoint folder instead"
        )
    return importlib.import_module(_CONVERTERS[model_name])
