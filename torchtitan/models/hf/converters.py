"""Model name -> its Hugging Face weight converter module (torch-free import).

A converter module provides:
- export_tensors(fqn, full, args): our full tensor -> [(Hugging Face name, tensor)];
- read_local(fqn, args, reader, index): this rank's part of `fqn` read through
  models.hf.weights.FolderReader (`index`: per dim the global indices the rank holds);
- hf_shapes(args), hf_config(args, dtype, bos_id, eos_id), config_mismatches(config, args);
- TIED_FALLBACK (Hugging Face names that a tied model stores under another name) and
  IGNORED (a regex of stored tensors that are not weights).
Optional: required(args, available) (the tensors a folder must hold, when that depends on
its layout), BUFFERS (a regex of checkpointed buffers), unread(args) / is_skipped(name,
args, config) / skip_note(names, args, config) (tensors left out on purpose),
rules_from_config(config) (what a folder fixes beyond shapes, as args fields, e.g. DeepSeek-V3's
YaRN rule), export_args(args, max_positions) and EXPORT_FIELDS (what an export must resolve),
RULE_FIELDS (rules a checkpoint marker carries to the runs started from it),
mtp_copies(args, tensors) (extra tensors written as copies).
"""

import dataclasses
import importlib

from torchtitan.models.registry import MODELS


def _module(model_name: str) -> str | None:
    entry = MODELS.get(model_name)
    return entry.hf_converter if entry is not None else None


def hf_converter(model_name: str):
    """The converter module of `model_name`; ValueError if the model has none yet."""
    module = _module(model_name)
    if module is None:
        having = [name for name, entry in MODELS.items() if entry.hf_converter]
        raise ValueError(
            f"model {model_name} has no Hugging Face weight converter yet (models with one:"
            f" {', '.join(having)}); start from a checkpoint folder instead"
        )
    return importlib.import_module(module)


def export_args(model_name: str, args, max_positions: int):
    """The run's args as an export describes them: max_seq_len = the flavor's context, and
    whatever the converter resolves at the training length (DeepSeek-V3's YaRN rule)."""
    resolve = (
        getattr(hf_converter(model_name), "export_args", None) if _module(model_name) else None
    )
    return (
        resolve(args, max_positions)
        if resolve
        else dataclasses.replace(args, max_seq_len=max_positions)
    )


def export_fields(model_name: str, args) -> dict:
    """What a checkpoint marker records for a later offline export (resolved at training length)."""
    if not _module(model_name):
        return {}
    fields = getattr(hf_converter(model_name), "EXPORT_FIELDS", ())
    resolved = export_args(model_name, args, args.max_seq_len)
    return {f: getattr(resolved, f) for f in fields if hasattr(resolved, f)}


def model_rules(model_name: str, args) -> dict:
    """The args' rule fields (RULE_FIELDS) as they are, for a checkpoint marker."""
    if not _module(model_name):
        return {}
    fields = getattr(hf_converter(model_name), "RULE_FIELDS", ())
    return {f: getattr(args, f) for f in fields if hasattr(args, f)}
