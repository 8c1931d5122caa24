"""Model name -> flavor shapes, and a run's args from them; importable without torch (used by
the config check)."""

import dataclasses

from torchtitan.models.registry import MODELS

MODEL_FLAVORS: dict[str, dict] = {name: entry.flavors for name, entry in MODELS.items()}


def model_args(name: str, flavor: str, vocab_size: int, seq_len: int, moe=None, mtp_depth: int = 0,
               initial_load_path: str = ""):
    """The flavor's args with the tokenizer's vocabulary (when the flavor leaves it open),
    a RoPE cache just long enough for training, the [moe] overrides (`moe`: JobConfig.moe)
    and the multi-token-prediction depth (`model.mtp_depth`; models that have the field).
    A Hugging Face folder as `initial_load_path` fixes what its config decides beyond the
    shapes (DeepSeek-V3: when YaRN applies), so the model computes what the folder's does; a
    checkpoint folder passes on the rules its marker recorded (`model_rules`)."""
    args = MODEL_FLAVORS[name][flavor]
    args = _from_hf_folder(name, args, initial_load_path)
    if mtp_depth:  # validate.check_mtp refused it for models without MTP
        args = dataclasses.replace(args, mtp_depth=mtp_depth)
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


def _from_hf_folder(name: str, args, path: str):
    from torchtitan.components import hf_folder

    if not path:
        return args
    if not hf_folder.is_hf_folder(path):
        return _from_checkpoint(args, path)
    from torchtitan.models.hf_converters import hf_converter

    try:
        converter = hf_converter(name)
    except ValueError:
        return args  # the config check reports it
    adopt = getattr(converter, "args_from_config", None)
    if adopt is None:
        return args
    try:
        config = hf_folder.read_config(path, "--checkpoint.initial_load_path")
    except hf_folder.HFFolderError:
        return args  # the config check reports it
    return adopt(config, args)


def _from_checkpoint(args, path: str):
    """A checkpoint's recorded rules (a model that came from a Hugging Face folder keeps its
    YaRN rule through scripts/convert_hf.py and through training checkpoints)."""
    from torchtitan.components.checkpoint_files import CheckpointError, read_marker

    try:
        marker = read_marker(path) or {}
    except (CheckpointError, OSError):
        return args  # the config check reports it
    rules = {k: v for k, v in (marker.get("model_rules") or {}).items() if hasattr(args, k)}
    return dataclasses.replace(args, **rules) if rules else args
