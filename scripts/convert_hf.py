#!/usr/bin/env python3
"""Convert between a saved checkpoint and a Hugging Face model folder, both ways, for
Llama3, DeepSeek-V3 and Qwen3 (dense and MoE).

Checkpoint -> Hugging Face folder (config.json, safetensors, tokenizer.json), loadable by
transformers' LlamaForCausalLM, DeepseekV3ForCausalLM, Qwen3ForCausalLM or Qwen3MoeForCausalLM:

    python scripts/convert_hf.py outputs/run/checkpoint/step-1000 outputs/run/hf-1000 \\
        [--tokenizer_path tokenizer.json] [--dtype bfloat16]

Any step folder a run saved works (full, model-only or seed); the model and flavor come from
its marker, the vocabulary from its embedding. A run can also write this folder itself at
its last step: --checkpoint.last_save_in_hf=true.

Hugging Face folder -> a model-only checkpoint step folder (the trainer's own format), for
--checkpoint.initial_load_path=<it>:

    python scripts/convert_hf.py path/to/hf-folder outputs/imported/step-0 \\
        --model deepseek_v3 --flavor 16B [--tokenizer_path tokenizer.json] [--dtype float32]

The folder is checked against the flavor first (nothing is written if it does not fit); the
vocabulary is the tokenizer's (default: the bundled one). A run can also start from the
Hugging Face folder directly (--checkpoint.initial_load_path=<folder>); converting once
saves every later start the conversion.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def _import_hf(args) -> int:
    """Hugging Face folder -> model-only DCP step folder."""
    from torchtitan.data.tokenizer import TokenizerError
    from torchtitan.hf_convert import import_folder
    from torchtitan.models.flavors import flavors_of
    from torchtitan.models.hf.converters import hf_converter
    from torchtitan.models.hf.folder import HFFolderError
    from torchtitan.models.registry import MODELS

    if not args.model or not args.flavor:
        return _fail(
            f"'{args.checkpoint}' is a Hugging Face folder: converting it needs --model and --flavor"
            f" (e.g. --model deepseek_v3 --flavor 16B)"
        )
    if args.model not in MODELS:
        return _fail(f"--model {args.model!r}: one of {', '.join(sorted(MODELS))}")
    if args.flavor not in flavors_of(args.model):
        return _fail(
            f"--flavor {args.flavor!r}: {args.model} has {', '.join(flavors_of(args.model))}"
        )
    try:
        hf_converter(args.model)
    except ValueError as e:
        return _fail(str(e))
    try:
        out, done = import_folder(
            args.checkpoint,
            args.out,
            args.model,
            args.flavor,
            args.tokenizer_path,
            dtype=args.dtype or "float32",
        )
    except (HFFolderError, TokenizerError, ValueError) as e:
        return _fail(str(e).strip().splitlines()[0])
    note = f"; {done.note}" if done.note else ""
    print(
        f"wrote {out}: {args.model} {args.flavor}, {done.tensors} tensors from {args.checkpoint}{note};"
        f" start a run with --checkpoint.initial_load_path={out}"
    )
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "checkpoint",
        help="a checkpoint step folder (<dump_folder>/checkpoint/step-N) or a Hugging Face"
        " model folder",
    )
    ap.add_argument("out", help="the folder to create (must not exist)")
    ap.add_argument(
        "--model", default="", help="Hugging Face folder in: the model name (llama3, deepseek_v3)"
    )
    ap.add_argument(
        "--flavor",
        default="",
        help="Hugging Face folder in: the flavor whose shapes the folder has",
    )
    ap.add_argument(
        "--tokenizer_path",
        default="",
        help="tokenizer.json the model was trained with (default: bundled)",
    )
    ap.add_argument(
        "--dtype",
        default="",
        choices=["", "float32", "bfloat16", "float16"],
        help="dtype of the written weights (default: the checkpoint's; float32 from a Hugging Face"
        " folder)",
    )
    ap.add_argument(
        "--shard_gib", type=float, default=4.0, help="largest safetensors file, GiB (default 4)"
    )
    args = ap.parse_args(argv)

    from torchtitan.checkpoint.files import DCP_METADATA
    from torchtitan.models.hf.folder import is_hf_folder

    if os.path.exists(args.out):
        return _fail(f"'{args.out}' already exists (nothing is overwritten); give a new folder")
    if args.tokenizer_path and not os.path.exists(args.tokenizer_path):
        return _fail(f"--tokenizer_path '{args.tokenizer_path}' not found")
    if is_hf_folder(args.checkpoint):
        return _import_hf(args)
    if not os.path.isfile(os.path.join(args.checkpoint, DCP_METADATA)):
        return _fail(
            f"'{args.checkpoint}' holds no checkpoint ({DCP_METADATA} missing) and is no Hugging Face folder"
            " (config.json + safetensors); give a step-N folder or a Hugging Face model folder"
        )
    if args.model or args.flavor:
        return _fail(
            "--model/--flavor are for a Hugging Face folder in; a checkpoint's marker names its model"
        )
    from torchtitan.hf_convert import export_checkpoint

    try:
        out = export_checkpoint(
            args.checkpoint,
            args.out,
            args.tokenizer_path,
            args.dtype,
            shard_bytes=int(args.shard_gib * 2**30),
        )
    except ValueError as e:
        return _fail(str(e))
    print(f"wrote {out}: " + ", ".join(sorted(os.listdir(out))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
