"""Writing pre-tokenized folders (the format: data/token_folder.py), for
scripts/tokenize_dataset.py.

The source is opened once, as the trainer opens it (data/kinds.open_documents: one scan of a
JSON Lines file), and its documents are cut into units: ranges of a shard's documents when the
shard's size is known, one unit per shard of a stream. Forked worker processes each write whole
units as part files; a unit is published by renaming its files into place, its counts file
last, so a killed run leaves only finished units and the same command resumes after them. The
work happens in OUT.partial/; the manifest is written last and the folder renamed to OUT, so a
folder with a manifest is always complete. Torch-free.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from torchtitan.data import token_folder as tf
from torchtitan.data.documents import DataError
from torchtitan.data.kinds import kind_of, open_documents

DOCS_PER_UNIT = 50_000
FLUSH_BYTES = 8 << 20


class WriteError(ValueError):
    """Input the writer refuses before writing anything; one line naming the flag."""


@dataclass(frozen=True)
class Unit:
    shard: int
    start: int
    stop: int | None  # None: to the shard's end (a stream)


def plan_units(src, num_proc: int) -> list[Unit]:
    units = []
    sizes = [src.shard_size(k) for k in range(src.num_shards)]
    known = [n for n in sizes if n is not None]
    chunks = max(4 * num_proc, -(-sum(known) // DOCS_PER_UNIT)) if known else 1
    per_chunk = max(1, -(-sum(known) // chunks)) if known else 0
    for k, n in enumerate(sizes):
        if n is None:
            units.append(Unit(k, 0, None))
        else:
            units += [Unit(k, a, min(n, a + per_chunk)) for a in range(0, n, per_chunk)] or [
                Unit(k, 0, 0)
            ]
    return units


_SOURCE = None  # the source, set before forking (children inherit it)


def _write_unit(job: tuple[int, Unit, str, str]) -> tuple[int, int, int, int, float]:
    """Write one unit as part-<i>; (index, docs, tokens, source bytes read, seconds)."""
    index, unit, folder, dtype = job
    start_time = time.perf_counter()
    name = os.path.join(folder, tf.part_name(index))
    src, before = _SOURCE, _SOURCE.bytes_read
    offsets, pending, pending_bytes, total = [0], [], 0, 0
    with open(name + ".bin.tmp", "wb") as bin_file:
        i = unit.start
        while unit.stop is None or i < unit.stop:
            doc = src.tokens(unit.shard, i)
            if doc is None:
                break
            arr = doc.astype(dtype, copy=False)
            pending.append(arr)
            pending_bytes += arr.nbytes
            total += len(arr)
            offsets.append(total)
            if pending_bytes >= FLUSH_BYTES:
                np.concatenate(pending).tofile(bin_file)
                pending, pending_bytes = [], 0
            i += 1
        if pending:
            np.concatenate(pending).tofile(bin_file)
    np.asarray(offsets, "<i8").tofile(name + ".idx.tmp")
    os.replace(name + ".bin.tmp", name + ".bin")
    os.replace(name + ".idx.tmp", name + ".idx")
    counts = {"shard": unit.shard, "docs": len(offsets) - 1, "tokens": total}
    with open(name + ".json.tmp", "w") as f:
        json.dump(counts, f)
    os.replace(name + ".json.tmp", name + ".json")  # the unit is done
    return index, counts["docs"], total, src.bytes_read - before, time.perf_counter() - start_time


def _done(folder: str, index: int) -> dict | None:
    try:
        with open(os.path.join(folder, tf.part_name(index) + ".json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def tokenize_dataset(
    dataset: str,
    out: str,
    tokenizer,
    num_proc: int = 1,
    split: str = "train",
    *,
    text_field: str = "text",
    config_name: str = "",
    log: Callable[[str], None] = print,
) -> dict:
    """Write the pre-tokenized folder of `dataset` at `out`; returns its manifest. WriteError
    before anything is written; DataError for a bad record met while writing (the finished
    units stay in OUT.partial for a re-run after the fix)."""
    global _SOURCE
    out = os.path.abspath(os.path.expanduser(out))
    partial = out + ".partial"
    if num_proc < 1:
        raise WriteError(f"--num-proc={num_proc}: must be >= 1")
    if os.path.exists(out):
        raise WriteError(f"--out: '{out}' exists; give a new folder (nothing is overwritten)")
    if kind_of(dataset).name == "tokens":
        raise WriteError(
            f"--dataset: '{dataset}' is already a pre-tokenized folder; train on it directly"
        )
    start = time.perf_counter()
    try:
        src = open_documents(dataset, split, config_name, text_field, tokenizer, section="training")
    except DataError as e:
        raise WriteError(str(e).replace("--training.dataset", "--dataset", 1)) from None
    units = plan_units(src, num_proc)
    dtype = tf.token_dtype(tokenizer.vocab_size)
    plan = {
        "dataset": dataset,
        "split": split,
        "text_field": text_field,
        "config_name": config_name,
        "tokenizer": tokenizer.fingerprint,
        "dtype": dtype,
        "units": [[u.shard, u.start, u.stop] for u in units],
    }
    os.makedirs(partial, exist_ok=True)
    plan_path = os.path.join(partial, "plan.json")
    if os.path.exists(plan_path):
        with open(plan_path) as f:
            if json.load(f) != plan:
                raise WriteError(
                    f"--out: '{partial}' holds an unfinished run of another source, tokenizer or split;"
                    " remove it, or give the same arguments to resume it"
                )
    else:
        with open(plan_path + ".tmp", "w") as f:
            json.dump(plan, f)
        os.replace(plan_path + ".tmp", plan_path)
    todo = [i for i in range(len(units)) if _done(partial, i) is None]
    done_before = len(units) - len(todo)
    log(
        f"[tokenize] {src.kind} source {dataset!r}: {src.num_shards} shard(s), {len(units)} unit(s)"
        + (f", {done_before} already done (resumed)" if done_before else "")
        + f", {num_proc} process(es), {dtype};"
        f" tokenizer {tokenizer.path} ({tokenizer.delimiting})"
    )
    _SOURCE = src
    docs = tokens = read = 0
    jobs = [(i, units[i], partial, dtype) for i in todo]
    pool = (
        multiprocessing.get_context("fork").Pool(num_proc)
        if num_proc > 1 and len(jobs) > 1
        else None
    )
    try:
        results = pool.imap_unordered(_write_unit, jobs) if pool else map(_write_unit, jobs)
        for n, (_, d, t, b, _) in enumerate(results, 1):
            docs, tokens, read = docs + d, tokens + t, read + b
            elapsed = time.perf_counter() - start
            eta = elapsed / n * (len(jobs) - n)
            log(
                f"[tokenize] {done_before + n}/{len(units)} units, {docs:,} documents, {tokens:,} tokens,"
                f" {tokens / elapsed:,.0f} tokens/s, {read / elapsed / 1e6:,.1f} MB/s read, ETA {_duration(eta)}"
            )
    finally:
        if pool is not None:
            pool.terminate()
        _SOURCE = None
    return _publish(
        partial,
        out,
        units,
        tokenizer,
        dtype,
        dataset=dataset,
        split=split,
        text_field=text_field,
        config_name=config_name,
        start=start,
        log=log,
    )


def _publish(
    partial, out, units, tokenizer, dtype, *, dataset, split, text_field, config_name, start, log
) -> dict:
    files, shard_docs = [], [0] * (max(u.shard for u in units) + 1)
    for i, unit in enumerate(units):
        counts = _done(partial, i)
        files.append({"name": tf.part_name(i), "docs": counts["docs"], "tokens": counts["tokens"]})
        shard_docs[unit.shard] += counts["docs"]
    manifest = {
        "format": tf.FORMAT,
        "version": tf.VERSION,
        "dtype": dtype,
        "tokenizer": {
            "fingerprint": tokenizer.fingerprint,
            "path": tokenizer.path,
            "vocab_size": tokenizer.vocab_size,
            "bos_id": tokenizer.bos_id,
            "eos_id": tokenizer.eos_id,
            "has_bos": tokenizer.has_bos,
            "delimiting": tokenizer.delimiting,
        },
        "source": {
            "dataset": dataset,
            "split": split,
            "text_field": text_field,
            "config_name": config_name,
        },
        "source_shards": shard_docs,
        "files": files,
        "docs": sum(f["docs"] for f in files),
        "tokens": sum(f["tokens"] for f in files),
    }
    for i in range(len(units)):
        os.remove(os.path.join(partial, tf.part_name(i) + ".json"))
    os.remove(os.path.join(partial, "plan.json"))
    with open(os.path.join(partial, tf.MANIFEST + ".tmp"), "w") as f:
        json.dump(manifest, f, indent=1)
    os.replace(os.path.join(partial, tf.MANIFEST + ".tmp"), os.path.join(partial, tf.MANIFEST))
    os.rename(partial, out)
    log(
        f"[tokenize] done: {manifest['docs']:,} documents, {manifest['tokens']:,} tokens ({dtype}) in"
        f" {len(files)} part(s), {_duration(time.perf_counter() - start)} wall, folder {out}"
    )
    return manifest


__all__ = ["DataError", "WriteError", "plan_units", "tokenize_dataset"]
