"""Documents -> packed (input, label) windows, laid out so that every parallel layout sees the
same global batches.

Row i of every step is cut from slot stream i (data/slots.py says which documents it reads),
each document tokenised for training (data/tokenizer.py) and packed back to back into windows
of seq_len + 1 tokens. With a mixture, window n of the job comes from the source
data/mixture.py names, each source with its own slot streams. A slot's position is four
integers per source (epoch, shard position, document index, tokens of it already used) plus
the windows it has made, so it is exact, tiny, and keyed by global slot id: another layout or
another count of loader workers picks out the slots it owns.

`SlotParts` is what a loader worker runs: it makes "parts" (a micro-step's rows, or a contiguous
group of them) for the slots it was given, and each part carries its slots' positions after it,
the bytes read and the epochs begun (numpy and plain data: cheap to send), so the main process knows the exact position of what it
handed to the trainer while workers read ahead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from torchtitan.data.documents import DataError, TruncatedShard
from torchtitan.data.slots import slot_plan

STATE_VERSION = 2


@dataclass
class Position:
    """Where one slot stands in one source."""

    epoch: int = 0
    shard_pos: int = 0  # which of the slot's shards
    index: int = -1  # document index in that shard (-1: not started)
    used: int = 0  # tokens of that document already in windows

    def as_tuple(self) -> tuple[int, int, int, int]:
        return (self.epoch, self.shard_pos, self.index, self.used)


class SlotStream:
    """One slot of one source: its documents packed into windows."""

    def __init__(
        self,
        docs,
        label: str,
        slot: int,
        num_slots: int,
        window: int,
        *,
        section: str,
        position: tuple | None = None,
    ):
        self.docs, self.label, self.slot, self.num_slots, self.window = (
            docs,
            label,
            slot,
            num_slots,
            window,
        )
        self.section = section
        self.plan = slot_plan(slot, num_slots, docs.num_shards)
        self.pos = Position(*position) if position else Position(index=self.plan.offset)
        if hasattr(docs, "want"):
            for shard in self.plan.shards:
                docs.want(shard, self.plan.stride, self.plan.offset)
        self._cached: tuple[tuple, np.ndarray] | None = None
        self.events: list[str] = []

    def _document(self) -> np.ndarray | None:
        key = (self.pos.epoch, self.pos.shard_pos, self.pos.index)
        if self._cached is not None and self._cached[0] == key:
            return self._cached[1]
        shard = self.plan.shards[self.pos.shard_pos]
        try:
            doc = self.docs.tokens(shard, self.pos.index, self.pos.epoch)
        except TruncatedShard as e:
            raise DataError(
                f"--{self.section}.dataset: {e.path} is truncated (document {e.doc} is cut off); re-create the folder"
                " with scripts/tokenize_dataset.py, then resume from the last checkpoint (it is intact)"
            ) from None
        self._cached = (key, doc) if doc is not None else None
        return doc

    def _next_shard(self) -> None:
        p = self.pos
        p.shard_pos, p.index, p.used = p.shard_pos + 1, self.plan.offset, 0
        if p.shard_pos == len(self.plan.shards):
            p.epoch, p.shard_pos = p.epoch + 1, 0
            self.events.append(
                f"{self.label}: epoch {p.epoch + 1} begins (its documents are read again)"
            )

    def next_window(self) -> np.ndarray:
        pieces, need, misses = [], self.window, 0
        while need:
            doc = self._document()
            if doc is None:  # past the shard's end
                misses += 1
                if misses > len(self.plan.shards):  # a whole pass over its shards found nothing
                    raise DataError(
                        f"--{self.section}.dataset: {self.label}: dataset slot {self.slot} of {self.num_slots} holds"
                        f" no documents: the dataset has fewer documents than the {self.num_slots} rows of a global"
                        " batch; add documents or lower the batch size"
                    )
                self._next_shard()
                continue
            misses = 0
            take = doc[self.pos.used : self.pos.used + need]
            pieces.append(take)
            need -= len(take)
            self.pos.used += len(take)
            if self.pos.used >= len(doc):
                self.pos.index, self.pos.used = self.pos.index + self.plan.stride, 0
        return np.concatenate(pieces).astype(np.int64, copy=False)


@dataclass
class SlotState:
    windows: int = 0  # windows this slot has made (= steps it has fed)
    positions: list = field(default_factory=list)  # per source, Position tuples (None: not started)

    def record(self) -> dict:
        return {
            "v": STATE_VERSION,
            "windows": self.windows,
            "positions": [tuple(p) if p else None for p in self.positions],
        }


def fresh_state(num_sources: int) -> dict:
    return SlotState(0, [None] * num_sources).record()


class SlotParts(IterableDataset):
    """Parts for the parts of `part_slots` this worker owns (part b goes to worker b % workers,
    as DataLoader's round robin hands them out), cycling for ever."""

    def __init__(
        self,
        sources: list,
        labels: list[str],
        pattern: list[int] | None,
        part_slots: list[list[int]],
        num_slots: int,
        *,
        seq_len: int,
        states: dict[int, dict],
        section: str = "training",
    ):
        self.sources, self.labels, self.pattern = sources, labels, pattern
        self.part_slots, self.num_slots, self.seq_len = part_slots, num_slots, seq_len
        self.states, self.section = states, section

    def _source_of(self, slot: int, windows: int) -> int:
        if self.pattern is None:
            return 0
        return self.pattern[(windows * self.num_slots + slot) % len(self.pattern)]

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        mine = list(range(worker, len(self.part_slots), workers))
        streams: dict[tuple[int, int], SlotStream] = {}
        windows = {s: self.states[s]["windows"] for p in mine for s in self.part_slots[p]}
        positions = {s: list(self.states[s]["positions"]) for s in windows}
        for s in (
            windows
        ):  # open every stream of this worker's slots now: streams register what they keep
            for k, pos in enumerate(positions[s]):
                streams[(s, k)] = SlotStream(
                    self.sources[k],
                    self.labels[k],
                    s,
                    self.num_slots,
                    self.seq_len + 1,
                    section=self.section,
                    position=pos,
                )
        while True:
            for p in mine:
                before = sum(getattr(src, "bytes_read", 0) for src in self.sources)
                rows, events = [], []
                try:
                    for s in self.part_slots[p]:
                        k = self._source_of(s, windows[s])
                        stream = streams[(s, k)]
                        rows.append(stream.next_window())
                        windows[s] += 1
                        positions[s][k] = stream.pos.as_tuple()
                        events += stream.events
                        stream.events = []
                except (
                    DataError
                ) as e:  # handed over as data: a worker's exception loses its one line
                    yield {"error": str(e)}
                    return
                yield {  # numpy, not tensors: pickled through the worker's pipe, no shared-memory segment a part
                    "part": p,
                    "windows": np.stack(rows),
                    "states": {
                        s: SlotState(windows[s], list(positions[s])).record()
                        for s in self.part_slots[p]
                    },
                    "bytes": sum(getattr(src, "bytes_read", 0) for src in self.sources) - before,
                    "events": events,
                }
