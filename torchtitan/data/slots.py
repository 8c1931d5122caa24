"""Which documents each global batch row reads: one rule for every kind of source.

A step's global batch has G rows ("slots"). Row i of every step is cut from slot i's own
stream of documents, packed into windows. The rule depends only on G and on the source's
shards (S of them: files of a folder, hub shards, the source shards a tokenized folder
records; 1 for a single file or the embedded corpus), never on the parallel layout, so every
layout sees the same batches and a checkpoint's per-slot positions re-split into any layout:

- S >= G: slot i owns the shards j with floor(j * G / S) == i, contiguously, and reads them
  whole, in order;
- S < G: slot i reads shard k = floor(i * S / G), which it shares with the n slots of the same
  k: the m-th of them reads documents m, m + n, m + 2n, ... of the shard.

With S = 1 that is "documents i, i + G, i + 2G, ...". A rank reads only the shards its slots
touch, each with one reader, so a job's reads stay proportional to what it consumes.
Torch-free and numpy-free: the checks and the docs use it too.
"""

from __future__ import annotations

from dataclasses import dataclass


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class SlotPlan:
    """What one slot reads: documents offset, offset + stride, ... of each of `shards` in turn."""

    shards: tuple[int, ...]
    stride: int
    offset: int


def slot_plan(slot: int, num_slots: int, num_shards: int) -> SlotPlan:
    if not 0 <= slot < num_slots or num_shards < 1:
        raise ValueError(f"slot {slot} of {num_slots} over {num_shards} shards")
    if num_shards >= num_slots:
        lo, hi = (
            _ceil_div(slot * num_shards, num_slots),
            _ceil_div((slot + 1) * num_shards, num_slots),
        )
        return SlotPlan(tuple(range(lo, hi)), 1, 0)
    shard = slot * num_shards // num_slots
    first = _ceil_div(shard * num_slots, num_shards)
    last = _ceil_div((shard + 1) * num_slots, num_shards)
    return SlotPlan((shard,), last - first, slot - first)


def empty_slot(shard_sizes: list[int], num_slots: int) -> int | None:
    """The first slot that would read no document at all, or None."""
    n = len(shard_sizes)
    for slot in range(num_slots):
        plan = slot_plan(slot, num_slots, n)
        if all(shard_sizes[k] <= plan.offset for k in plan.shards):
            return slot
    return None


def shards_read(slots, num_slots: int, num_shards: int) -> list[int]:
    """The shards a reader of `slots` opens (each once), in order."""
    return sorted({k for s in slots for k in slot_plan(s, num_slots, num_shards).shards})


def read_amplification(rows_per_rank: int, num_slots: int, num_shards: int) -> float:
    """Shard reads of the whole job per shard, when every rank holds `rows_per_rank`
    consecutive slots: 1.0 means each document is read once."""
    ranks = max(1, num_slots // rows_per_rank)
    reads = sum(
        len(shards_read(range(r * rows_per_rank, (r + 1) * rows_per_rank), num_slots, num_shards))
        for r in range(ranks)
    )
    return reads / num_shards


def read_case(
    kind: str, num_shards: int, num_slots: int, rows_per_rank: int
) -> tuple[str, str | None]:
    """(what the start line says about reads, the fix when documents are read more than once).

    `kind`: 'tokenized' / 'indexed' (random access: each byte read once) or 'stream'."""
    if kind in ("tokenized", "indexed"):
        what = "pre-tokenized folder" if kind == "tokenized" else "raw text"
        return f"{what}, random access: each document read once", None
    if num_slots <= rows_per_rank * num_shards:  # every rank's slots cover whole shards
        amp = (
            read_amplification(rows_per_rank, num_slots, num_shards) if num_slots <= 65536 else 1.0
        )
        if amp <= 1.05:
            return f"stream of {num_shards} shards: each document read once", None
    else:
        amp = _ceil_div(num_slots, num_shards * rows_per_rank)
    fix = (
        f"reads x{amp:.2f} of the source: {num_shards} shard(s) for {num_slots} rows of {rows_per_rank} per rank;"
        " give it as more shards, or pre-tokenize it (scripts/tokenize_dataset.py) for random access"
    )
    return f"stream of {num_shards} shard(s), one reader per rank and shard", fix
