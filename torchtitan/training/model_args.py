"""The model args a run builds its model from, torch-free: the checks, the dry run, the memory
prediction and the trainer all take them from `run_model_args`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchtitan.checkpoint.files import marker_rules
from torchtitan.data.tokenizer import load_model_tokenizer
from torchtitan.models.flavors import flavors_of, model_args
from torchtitan.models.hf.folder import folder_rules, is_hf_folder

if TYPE_CHECKING:
    from torchtitan.config.job_config import JobConfig


def initial_rules(model_name: str, path: str) -> dict:
    """What the weights a run starts from (`checkpoint.initial_load_path`) fix beyond the
    flavor's shapes, as args fields: a Hugging Face folder's rules (its converter reads them
    from config.json), or the rules a checkpoint's marker recorded; {} for none."""
    if not path:
        return {}
    return folder_rules(path, model_name) if is_hf_folder(path) else marker_rules(path)


def vocab_size(cfg: JobConfig) -> int:
    """The vocabulary the flavor takes from the tokenizer (loaded once per process), 0 when the
    flavor fixes its own."""
    m = cfg.model
    return 0 if flavors_of(m.name)[m.flavor].vocab_size else load_model_tokenizer(m).vocab_size


def run_model_args(cfg: JobConfig, vocab: int | None = None):
    """The args of the job's model: the flavor with the tokenizer's vocabulary (`vocab`, or
    read when None), the training length, the [moe] overrides, the MTP depth and the rules of
    the initial weights (flavors.model_args)."""
    m = cfg.model
    vocab = vocab_size(cfg) if vocab is None else vocab
    return model_args(
        m.name,
        m.flavor,
        vocab,
        cfg.training.seq_len,
        cfg.moe,
        mtp_depth=m.mtp_depth,
        rules=initial_rules(m.name, cfg.checkpoint.initial_load_path),
    )
