"""Model name -> flavor shapes, and a run's args from them; importable without torch (used by
the config check)."""

import dataclasses

from torchtitan.models.registry import MODELS

MODEL_FLAVORS: dict[str, dict] = {name: entry.flavors for name, entry in MODELS.items()}


def model_args(name: str, flavor: str, vocab_size: int, seq_len: int, moe=None, mtp_depth: int = 0):
    """The flavor's args with the tokenizer's vocabulary (when the flavor leaves it open),
    a RoPE cache just long enough for training, the [moe] overrides (`moe`: JobConfig.moe)
    and the multi-token-prediction depth (`model.mtp_depth`; models that have the field)."""
    args = MODEL_FLAVORS[name][flavor]
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
