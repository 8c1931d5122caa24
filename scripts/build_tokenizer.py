#!/usr/bin/env python3
"""Build the small byte-level BPE tokenizer bundled for tests and the default run.

    python scripts/build_tokenizer.py [--vocab-size 2048] [--out torchtitan/assets/tokenizer.json]

Trained on the embedded pydoc corpus; BOS/EOS use Llama3's names so the same code path
serves the real Llama3 tokenizer.json.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

from torchtitan.data.corpus import pydoc_documents  # noqa: E402
from torchtitan.data.tokenizer import BUNDLED_TOKENIZER  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--vocab-size", type=int, default=2048)
    ap.add_argument("--out", default=BUNDLED_TOKENIZER)
    args = ap.parse_args()

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=args.vocab_size,
        special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(pydoc_documents(), trainer=trainer)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    tok.save(args.out)
    print(f"wrote {args.out}: vocab {tok.get_vocab_size()}")


if __name__ == "__main__":
    main()
