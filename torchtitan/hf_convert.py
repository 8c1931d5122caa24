"""Checkpoints <-> Hugging Face folders in one process, without a process group (the entry
point of scripts/convert_hf.py): a saved step folder to a Hugging Face folder, and a Hugging
Face folder to the model-only step folder a run's --checkpoint.initial_load_path accepts."""

import dataclasses
import os
import shutil
import warnings

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader

from torchtitan.checkpoint.files import marker_record, read_marker, run_record, write_marker
from torchtitan.checkpoint.states import ModelState
from torchtitan.config.job_config import Checkpoint, JobConfig, Model, Training
from torchtitan.data.tokenizer import load_tokenizer
from torchtitan.dtypes import DTYPES
from torchtitan.models.flavors import flavors_of
from torchtitan.models.hf.converters import export_fields, hf_converter, model_rules
from torchtitan.models.hf.folder import check_folder
from torchtitan.models.hf.weights import (
    SHARD_BYTES,
    HFLoad,
    ShardWriter,
    convert_full,
    load_hf_weights,
    write_metadata,
)
from torchtitan.training.build import model_on_meta
from torchtitan.training.model_args import run_model_args


def export_checkpoint(
    checkpoint: str,
    folder: str,
    tokenizer_path: str = "",
    dtype: str = "",
    shard_bytes: int = SHARD_BYTES,
) -> str:
    """A saved checkpoint folder (step-N: full, model-only or seed) -> the Hugging Face folder
    `folder`, in one process without a process group. The model comes from the checkpoint's
    marker, the vocabulary from its embedding; dtype "" = the checkpoint's own."""
    marker = read_marker(checkpoint) or {}
    if "/" not in marker.get("model", ""):
        raise ValueError(
            f"checkpoint '{checkpoint}' has no .complete marker naming its model; give a step-N folder"
            " that a finished save wrote"
        )
    model_name, flavor = marker["model"].split("/", 1)
    meta = FileSystemReader(checkpoint).read_metadata().state_dict_metadata
    state = {
        k[len("model.") :]: torch.empty(v.size, dtype=v.properties.dtype)
        for k, v in meta.items()
        if k.startswith("model.") and hasattr(v, "size")
    }
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.load({"model": state}, checkpoint_id=checkpoint, no_dist=True)
    vocab = state["tok_embeddings.weight"].shape[0]
    args = dataclasses.replace(flavors_of(model_name)[flavor], vocab_size=vocab)
    # What the run resolved at its training length (DeepSeek-V3: YaRN rule, MTP depth).
    names = {f.name for f in dataclasses.fields(args)}
    fields = {k: v for k, v in (marker.get("hf_args") or {}).items() if k in names}
    args = dataclasses.replace(args, **fields)
    # The tokenizer the run recorded in the marker, unless another is given.
    if not tokenizer_path and os.path.isfile(marker.get("tokenizer", "")):
        tokenizer_path = marker["tokenizer"]
    tokenizer = load_tokenizer(tokenizer_path)
    if tokenizer.vocab_size > vocab or (not tokenizer_path and tokenizer.vocab_size != vocab):
        raise ValueError(
            f"--tokenizer_path: '{tokenizer.path}' has {tokenizer.vocab_size} tokens, the checkpoint's"
            f" embedding {vocab} rows; give the tokenizer the model was trained with"
        )
    dtype = dtype or marker.get("dtype") or "float32"
    tmp = folder + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    writer = ShardWriter(tmp, "model", shard_bytes)
    convert_full(state.items(), model_name, args, dtype, writer)
    if writer.error:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ValueError(writer.error)
    config = hf_converter(model_name).hf_config(args, dtype, tokenizer.bos_id, tokenizer.eos_id)
    write_metadata(tmp, config, writer.weight_map, writer.total_bytes, tokenizer.path)
    os.replace(tmp, folder)
    return folder


def import_folder(
    folder: str,
    out: str,
    model_name: str,
    flavor: str,
    tokenizer_path: str = "",
    *,
    dtype: str = "float32",
) -> tuple[str, HFLoad]:
    """A Hugging Face folder -> the model-only DCP step folder `out` that a run's
    --checkpoint.initial_load_path accepts (the trainer's own model-only format: "model."
    keys, a `.complete` marker naming model, flavor, dtype, tokenizer and the resolved
    hf_args), in one process without a process group. The folder is checked against the
    flavor (HFFolderError, nothing written); the model is built on CPU with the folder's
    rules (DeepSeek-V3: YaRN) and the tokenizer's vocabulary, filled by load_hf_weights,
    written to `out`.tmp and renamed into place."""
    key = "convert_hf.py"
    tokenizer = load_tokenizer(tokenizer_path)
    # the job a run started from the folder would be: the flavor at its full context, the folder's rules
    cfg = JobConfig(
        model=Model(name=model_name, flavor=flavor, tokenizer_path=tokenizer_path),
        training=Training(seq_len=flavors_of(model_name)[flavor].max_seq_len),
        checkpoint=Checkpoint(initial_load_path=folder),
    )
    args = run_model_args(cfg, tokenizer.vocab_size)
    check_folder(folder, model_name, flavor, args, key=key)
    model = model_on_meta(cfg, args).model
    model.to_empty(device="cpu")
    model.init_weights(
        0, torch.device("cpu")
    )  # buffers and caches; every checkpointed tensor is read below
    done = load_hf_weights([model], folder, model_name, args, key=key)
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        with (
            warnings.catch_warnings()
        ):  # "assuming the intent is to save in a single process": it is
            warnings.simplefilter("ignore", UserWarning)
            dcp.save({"model": ModelState([model], DTYPES[dtype])}, checkpoint_id=tmp, no_dist=True)
        run = run_record(
            f"{model_name}/{flavor}",
            1,
            {},
            tokenizer.path,
            export_fields(model_name, args),
            model_rules=model_rules(model_name, args),
        )
        write_marker(tmp, marker_record(0, True, dtype, run, hf_source=os.path.abspath(folder)))
        os.replace(tmp, out)
    finally:  # no partial folder stays, whatever stopped the save (gone after the rename)
        shutil.rmtree(tmp, ignore_errors=True)
    return out, done
