#!/usr/bin/env python3
"""Export a saved checkpoint as a Hugging Face model folder (config.json, safetensors,
tokenizer.json), loadable by transformers' LlamaForCausalLM.

    python scripts/convert_hf.py outputs/run/checkpoint/step-1000 outputs/run/hf-1000 \\
        [--tokenizer_path tokenizer.json] [--dtype bfloat16]

Any step folder a run saved works (full, model-only or seed); the model and flavor come from
its marker, the vocabulary from its embedding. The other direction needs no conversion:
start a run with --checkpoint.initial_load_path=<Hugging Face folder>. A run can also write
this folder itself at its last step: --checkpoint.last_save_in_hf=true.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", help="a checkpoint step folder, e.g. <dump_folder>/checkpoint/step-N")
    ap.add_argument("out", help="the Hugging Face folder to create (must not exist)")
    ap.add_argument("--tokenizer_path", default="", help="tokenizer.json the model was trained with (default: bundled)")
    ap.add_argument("--dtype", default="", choices=["", "float32", "bfloat16", "float16"],
                    help="dtype of the written weights (default: the checkpoint's)")
    ap.add_argument("--shard_gib", type=float, default=4.0, help="largest safetensors file, GiB (default 4)")
    args = ap.parse_args(argv)

    from torchtitan.components.checkpoint_files import DCP_METADATA

    if not os.path.isfile(os.path.join(args.checkpoint, DCP_METADATA)):
        print(f"error: '{args.checkpoint}' holds no checkpoint ({DCP_METADATA} missing); give a step-N folder",
              file=sys.stderr)
        return 2
    if os.path.exists(args.out):
        print(f"error: '{args.out}' already exists (nothing is overwritten); give a new folder", file=sys.stderr)
        return 2
    if args.tokenizer_path and not os.path.exists(args.tokenizer_path):
        print(f"error: --tokenizer_path '{args.tokenizer_path}' not found", file=sys.stderr)
        return 2
    from torchtitan.components.hf_weights import export_checkpoint

    try:
        out = export_checkpoint(args.checkpoint, args.out, args.tokenizer_path, args.dtype,
                                shard_bytes=int(args.shard_gib * 2**30))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out}: " + ", ".join(sorted(os.listdir(out))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
