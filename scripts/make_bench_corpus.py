#!/usr/bin/env python3
"""A realistic local corpus and tokenizer for scripts/bench_data.py, from text every CPython
ships (no download):

    python scripts/make_bench_corpus.py --out /tmp/bench [--mb 150] [--vocab-size 32768]

- OUT/corpus.jsonl: ~MB megabytes of JSON Lines, documents of ~2.5 KB cut from the standard
  library's .py sources (cycled until the size is reached), field "text";
- OUT/tokenizer.json: a byte-level BPE tokenizer of VOCAB_SIZE tokens (Llama3's BOS/EOS
  names) trained on the sources once (~40 MB: enough for the vocabulary to fill; the 465 KB
  embedded corpus stops near 12.5K).
Deterministic; what exists is kept.
"""

import argparse
import json
import os
import sysconfig
import time


def stdlib_text() -> str:
    root = sysconfig.get_paths()["stdlib"]
    texts = []
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".py"):
                try:
                    with open(os.path.join(folder, name), encoding="utf-8") as f:
                        texts.append(f.read())
                except (OSError, UnicodeDecodeError):
                    pass
    return "\n".join(texts)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", required=True)
    ap.add_argument("--mb", type=float, default=150)
    ap.add_argument("--vocab-size", type=int, default=32768)
    ap.add_argument("--doc-chars", type=int, default=2500)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    text = stdlib_text()
    corpus = os.path.join(args.out, "corpus.jsonl")
    if not os.path.exists(corpus):
        start = time.perf_counter()
        docs = [text[i : i + args.doc_chars] for i in range(0, len(text), args.doc_chars)]
        size = n = 0
        with open(corpus + ".tmp", "w") as f:
            while size < args.mb * 1e6:
                line = json.dumps({"text": docs[n % len(docs)]}) + "\n"
                f.write(line)
                size, n = size + len(line), n + 1
        os.replace(corpus + ".tmp", corpus)
        print(
            f"wrote {corpus}: {n:,} documents, {size / 1e6:.1f} MB, {time.perf_counter() - start:.1f}s"
        )
    tok_path = os.path.join(args.out, "tokenizer.json")
    if not os.path.exists(tok_path):
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        start = time.perf_counter()
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=args.vocab_size,
            special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(
            (text[i : i + 100_000] for i in range(0, min(len(text), 40_000_000), 100_000)),
            trainer=trainer,
        )
        tok.save(tok_path)
        print(
            f"wrote {tok_path}: vocabulary {tok.get_vocab_size():,}, trained on"
            f" {min(len(text), 40_000_000) / 1e6:.0f} MB in {time.perf_counter() - start:.1f}s"
        )


if __name__ == "__main__":
    main()
