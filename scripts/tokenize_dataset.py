#!/usr/bin/env python3
"""Pre-tokenize a dataset into a folder the trainer reads with no tokenizer work at run time:

    python scripts/tokenize_dataset.py --dataset data/web.jsonl --out data/web_tokens \
        [--tokenizer path/to/tokenizer.json] [--num-proc 8] [--split train] [--text-field text]

--dataset takes every form --training.dataset does (pydoc, local files and folders, hub
names). Progress and an ETA are printed per finished unit; a killed run resumes when the same
command is run again (its work is in OUT.partial/); OUT appears only when complete and is never
overwritten. Then train with --training.dataset=OUT and the same tokenizer (docs/data.md).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--dataset", required=True, help="any form --training.dataset takes")
    ap.add_argument("--out", required=True, help="the folder to create")
    ap.add_argument(
        "--tokenizer", default="", help="tokenizer.json (or its folder); empty: the bundled one"
    )
    ap.add_argument("--num-proc", type=int, default=1, help="worker processes")
    ap.add_argument("--split", default="train")
    ap.add_argument("--text-field", default="text")
    ap.add_argument("--config-name", default="", help="subset of a hub dataset")
    args = ap.parse_args(argv)

    from torchtitan.checks.data import check_dataset_path
    from torchtitan.config.manager import ConfigError
    from torchtitan.data.token_writer import DataError, WriteError, tokenize_dataset
    from torchtitan.data.tokenizer import TokenizerError, load_tokenizer
    from torchtitan.messages import one_line

    def fail(line: str, code: int = 2) -> int:
        print(f"error: {line}", file=sys.stderr, flush=True)
        return code

    try:
        check_dataset_path(args.dataset)
    except ConfigError as e:
        return fail(str(e).replace("--training.dataset", "--dataset", 1))
    try:
        tokenizer = load_tokenizer(args.tokenizer)
    except TokenizerError as e:
        return fail(f"--tokenizer: {one_line(e, 300)}")
    try:
        tokenize_dataset(
            args.dataset,
            args.out,
            tokenizer,
            args.num_proc,
            args.split,
            text_field=args.text_field,
            config_name=args.config_name,
            log=lambda line: print(line, flush=True),
        )
    except WriteError as e:
        return fail(str(e))
    except DataError as e:  # a bad record: finished units stay for the re-run
        return fail(
            f"{e} (finished units are kept in {os.path.abspath(args.out)}.partial; re-run to resume)",
            1,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
