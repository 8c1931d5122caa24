#!/usr/bin/env python3
"""Data loading throughput and reads per rank, raw text vs pre-tokenized, for several global
batch row counts G (rank 0 of dp = G / local_batch, no accumulation):

    python scripts/make_bench_corpus.py --out /tmp/bench
    python scripts/tokenize_dataset.py --dataset /tmp/bench/corpus.jsonl --out /tmp/bench/tokens \
        --tokenizer /tmp/bench/tokenizer.json --num-proc 2
    python scripts/bench_data.py --corpus /tmp/bench/corpus.jsonl --tokenized /tmp/bench/tokens \
        --tokenizer /tmp/bench/tokenizer.json [--slots 16,1024,4096] [--workers 0,2] [--seconds 10]

Printed in the same run: the tokenizer's own encode rate on one core (documents of the corpus
encoded one at a time, as the loader does), then per (G, source, workers): tokens/s delivered
to the trainer, the loader's build time (a raw file's one scan of its line starts included),
bytes read per byte delivered, bytes read per byte of the distinct documents read (1.000: no
document read twice in an epoch; counted without workers; a fast source passes several epochs
of rank 0's documents in the measured seconds), and the peak resident memory of this process. Reads are counted
by the loader's own instrumentation (`bytes_read`: file bytes of the documents read, and the
scan of the line starts counted apart), not by the OS (page-cache hits do not show there).
"Delivered" is the source bytes of the tokens handed over: tokens x the source's bytes per
token (the JSONL file's bytes, or the folder's, / all its tokens). A last row: one rank holding all 1,024 rows (seq 64), the
case that ran out of memory before.
"""

import argparse
import json
import os
import resource
import sys
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # one core for the tokenizer, as in a loader worker
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def encode_rate(corpus: str, tok, seconds: float) -> tuple[float, float]:
    """(tokens/s, bytes per token) of Tokenizer.encode over the corpus's documents, one core."""
    with open(corpus) as f:
        docs = [
            json.loads(line)["text"] for i, line in enumerate(f) if i % 50 == 0
        ]  # a sample of the whole file
    tokens = nbytes = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for d in docs:
            tokens += len(tok.encode(d))
            nbytes += len(d.encode())
    elapsed = time.perf_counter() - start
    return tokens / elapsed, nbytes / tokens


def measure(
    dataset: str,
    tok,
    slots: int,
    local_batch: int,
    seq: int,
    workers: int,
    seconds: float,
    bytes_per_token: float,
) -> dict:
    from torchtitan.config import build_config
    from torchtitan.data.dataloader import build_dataloader

    cfg = build_config(
        [
            f"--training.dataset={dataset}",
            f"--training.local_batch_size={local_batch}",
            f"--training.seq_len={seq}",
        ]
    )[0].training
    dp = slots // local_batch
    start = time.perf_counter()
    loader = build_dataloader(cfg, tok, 0, dp, 1, workers=workers)
    first = {}  # (epoch, shard, index) -> bytes of its first read: each document counted once an epoch
    if workers == 0:
        src, tokens_of = loader.sources[0], loader.sources[0].tokens

        def counted(shard, index, epoch=0):
            before = src.bytes_read
            doc = tokens_of(shard, index, epoch)
            first.setdefault((epoch, shard, index), src.bytes_read - before)
            return doc

        src.tokens = counted
    it = iter(loader)
    next(it)  # workers started, first part made
    build = time.perf_counter() - start
    scanned = sum(getattr(s, "scanned", 0) for s in loader.sources)
    read0, n, start = loader.bytes_read, 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        next(it)
        n += 1
    elapsed = time.perf_counter() - start
    tokens = n * local_batch * seq
    delivered = tokens * bytes_per_token
    distinct = sum(first.values())
    del it
    return {
        "tokens_s": tokens / elapsed,
        "build_s": build,
        "read_x": (loader.bytes_read - read0) / delivered,
        "once_x": loader.bytes_read / distinct if distinct else float("nan"),
        "scan_mb": scanned / 1e6,
        "rss_mb": rss_mb(),
        "kind": loader.sources[0].kind,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--tokenized", default="")
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--slots", default="16,1024,4096")
    ap.add_argument("--workers", default="0")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--local-batch", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=10)
    args = ap.parse_args()

    from torchtitan.data.tokenizer import Tokenizer

    tok = Tokenizer(args.tokenizer)
    rate, raw_bpt = encode_rate(args.corpus, tok, args.seconds)
    print(
        f"tokenizer {args.tokenizer}: vocabulary {tok.vocab_size:,}, encode rate on one core {rate:,.0f} tokens/s"
        f" ({raw_bpt:.2f} bytes per token)",
        flush=True,
    )
    sources = [("raw", args.corpus)] + ([("tokenized", args.tokenized)] if args.tokenized else [])
    bpt = {"raw": raw_bpt}  # the source's bytes per token: what a delivered token stands for
    if args.tokenized:
        with open(os.path.join(args.tokenized, "manifest.json")) as f:
            m = json.load(f)
        bpt["raw"] = os.path.getsize(args.corpus) / m["tokens"]
        folder_bytes = sum(
            os.path.getsize(os.path.join(args.tokenized, n)) for n in os.listdir(args.tokenized)
        )
        bpt["tokenized"] = folder_bytes / m["tokens"]
    rows = []
    for slots in map(int, args.slots.split(",")):
        for kind, path in sources:
            for workers in map(int, args.workers.split(",")):
                r = measure(
                    path, tok, slots, args.local_batch, args.seq, workers, args.seconds, bpt[kind]
                )
                rows.append((slots, kind, workers, args.local_batch, args.seq, r))
                print(
                    f"G {slots:>5} {kind:>9} workers {workers}: {r['tokens_s']:>12,.0f} tokens/s, build {r['build_s']:.2f}s,"
                    f" read/delivered x{r['read_x']:.3f}, read/distinct documents x{r['once_x']:.3f} (+ line scan"
                    f" {r['scan_mb']:.0f} MB), peak RSS"
                    f" {r['rss_mb']:,.0f} MB",
                    flush=True,
                )
    r = measure(args.corpus, tok, 1024, 1024, 64, 0, args.seconds, bpt["raw"])
    rows.append((1024, "raw", 0, 1024, 64, r))
    print(
        "\n| G | source | workers | rows on the rank x seq | tokens/s per rank | build s | read / delivered"
        " | read / distinct documents | line scan MB | peak RSS MB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for slots, kind, workers, lbs, seq, r in rows:
        once = "-" if r["once_x"] != r["once_x"] else f"{r['once_x']:.3f}"
        print(
            f"| {slots:,} | {kind} | {workers} | {lbs} x {seq} | {r['tokens_s']:,.0f} | {r['build_s']:.2f} |"
            f" {r['read_x']:.3f} | {once} | {r['scan_mb']:.0f} | {r['rss_mb']:,.0f} |"
        )
    print(
        f"\ngoals: raw >= 80% of encode rate x workers ({0.8 * rate:,.0f} tokens/s per worker, or on the"
        " training thread with 0 workers); pre-tokenized >= 2,000,000 tokens/s; random access read / delivered <= 1.05"
    )


if __name__ == "__main__":
    main()
