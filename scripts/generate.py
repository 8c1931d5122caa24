#!/usr/bin/env python3
"""Generate text from a checkpoint: the CLI of torchtitan/generate.py (it prints; the library
returns the text). scripts/run_generate.sh launches it on NGPU ranks (tensor parallel).

    python scripts/generate.py --job.config_file train_configs/llama3_debug.toml \\
        --checkpoint outputs/llama3_debug/checkpoint --prompt "def main():" \\
        --max_new_tokens 32 [--temperature 0.8 --top_k 50 --seed 3] [--out report.json]

Any other --section.key=value is a config override, as for run_train.sh. Bad input is one
line on stderr and exit 2, before any process group starts; docs/generate.md has the rest.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv: list[str]) -> int:
    from torchtitan.data.tokenizer import TokenizerError
    from torchtitan.distributed.process_groups import DeviceError
    from torchtitan.generate import ConfigError, GenerateError, parse, run

    first = os.environ.get("RANK", "0") == "0"
    try:
        options, cfg = parse(argv)
        result = run(options, cfg)
    except (ConfigError, GenerateError, DeviceError, TokenizerError) as e:
        if first:  # every rank fails alike, before any process group: one line in all
            print(f"error: {e}", file=sys.stderr)
        return 2
    if result is None:  # --check_only
        return 0
    if first:
        print(f"prompt: {result.prompt!r}")
        print(f"completion: {result.completion!r}")
        print(
            f"{len(result.new_ids)} new tokens in {result.seconds:.2f}s:"
            f" {result.tokens_per_second:.1f} tokens/s on {result.world_size} rank(s)"
            f" ({result.source.kind} checkpoint {result.source.path})"
        )
        if options.out:
            with open(options.out, "w") as f:
                json.dump(result.record(), f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
