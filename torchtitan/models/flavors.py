"""Model name -> flavor shapes, and a run's args from them; importable without torch (used by
the config check)."""

import dataclasses

from torchtitan.models.protocol import MOE_OVERRIDES
from torchtitan.models.registry import MODELS, model_entry


def flavors_of(name: str) -> dict:
    """The flavors (name -> args) of a registered model."""
    return model_entry(name).flavors


def model_args(
    name: str,
    flavor: str,
    vocab_size: int,
    seq_len: int,
    moe=None,
    *,
    mtp_depth: int = 0,
    rules: dict | None = None,
):
    """The flavor's args with the tokenizer's vocabulary (when the flavor leaves it open),
    a RoPE cache just long enough for training, the [moe] overrides (`moe`: JobConfig.moe;
    "auto" keeps the flavor's value), the multi-token-prediction depth (`model.mtp_depth`;
    models that have the field) and `rules`: the fields the weights a run starts from fix
    beyond the shapes (training/model_args.initial_rules; e.g. DeepSeek-V3's YaRN rule)."""
    args = flavors_of(name)[flavor]
    fields = {f.name for f in dataclasses.fields(args)}
    fixed = {k: v for k, v in (rules or {}).items() if k in fields}
    if fixed:
        args = dataclasses.replace(args, **fixed)
    if mtp_depth:  # the checks refused it for models without MTP
        args = dataclasses.replace(args, mtp_depth=mtp_depth)
    if moe is not None and args.moe is not None:
        overrides = {field: getattr(moe, key) for key, field in MOE_OVERRIDES.items()}
        args = dataclasses.replace(args, **{k: v for k, v in overrides.items() if v != "auto"})
    if args.vocab_size and args.vocab_size < vocab_size:
        raise ValueError(
            f"--model.tokenizer_path: tokenizer has {vocab_size} tokens but {name} {flavor} has only"
            f" {args.vocab_size} embeddings; use a matching tokenizer"
        )
    return dataclasses.replace(args, vocab_size=args.vocab_size or vocab_size, max_seq_len=seq_len)


__all__ = ["MODELS", "flavors_of", "model_args"]
