"""Text datasets -> packed (input, label) windows, laid out so that every parallel layout
sees the same global batches.

The global batch has `G = global_batch_size` rows. Row i of every step is drawn from its
own *slot stream*: documents i, i+G, i+2G, ... of the source (HF `split_dataset_by_node`
with G "nodes"), tokenised with BOS/EOS and packed into windows of seq_len + 1 tokens. A
data-parallel rank owns a contiguous range of slots (its rows of all its gradient
accumulation micro-steps), so ranks read disjoint documents, and 1 rank with gradient
accumulation trains on exactly the same rows as N ranks without it: losses are comparable
across layouts, and the per-slot state can be re-split when a checkpoint is loaded into
another layout.
"""

import functools
from typing import Callable, Iterator

import torch
from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import IterableDataset

from torchtitan.data.sources import LOCAL_FILE_BUILDERS, DocumentError, document_text
from torchtitan.data.tokenizer import Tokenizer
from torchtitan.messages import one_line


class DataError(RuntimeError):
    """A document the run cannot use (no text field, not a string, unreadable data), met past
    the first records the config check read. The message is one line naming the key."""


def _describe(make_source: Callable) -> str:
    """'<dataset>' (split '<split>') when the source is a partial of open_source, as the loaders build it."""
    if isinstance(make_source, functools.partial) and make_source.args:
        split = make_source.args[1] if len(make_source.args) > 1 else make_source.keywords.get("split", "train")
        return f"dataset '{make_source.args[0]}' (split '{split}')"
    return "the dataset"


def _is_logged_read_error(record) -> bool:
    return not str(record.msg).startswith("Failed to ")


def _drop_logged_read_errors() -> None:
    """The file builders log "Failed to load JSON from file ..." (or "Failed to read ...") and
    then raise; the raise becomes a DataError line, so the log line would only repeat it."""
    import logging

    for builder in set(LOCAL_FILE_BUILDERS.values()):
        builder_logger = logging.getLogger(f"datasets.packaged_modules.{builder}.{builder}")
        if _is_logged_read_error not in builder_logger.filters:
            builder_logger.addFilter(_is_logged_read_error)


class _SlotStream:
    """Documents slot, slot + num_slots, ... of the source, packed into fixed windows."""

    def __init__(self, make_source: Callable, slot: int, num_slots: int, tokenizer, window: int, text_field: str,
                 section: str = "training"):
        self.make_source, self.slot, self.num_slots = make_source, slot, num_slots
        self.tokenizer, self.window, self.text_field = tokenizer, window, text_field
        self.section = section
        self.buffer: list[int] = []
        self.epoch = 0
        self._source_state = None
        self._open()

    def _open(self, state=None):
        from datasets.distributed import split_dataset_by_node

        _drop_logged_read_errors()
        try:
            source = self.make_source()
            # Split by examples (the "auto" strategy unless the shards divide evenly): this slot
            # reads documents slot, slot + num_slots, ..., so a document's index is known.
            by_example = self.num_slots == 1 or source.num_shards % self.num_slots != 0
            self.source = split_dataset_by_node(source, rank=self.slot, world_size=self.num_slots)
            if state is not None:
                self.source.load_state_dict(state)
            self.iterator = iter(self.source)
        except Exception as e:
            raise DataError(
                f"--{self.section}.dataset: cannot open {_describe(self.make_source)} ({one_line(e)});"
                " check that it is still there and readable"
            ) from e
        self.read = 0 if state is None and by_example else None  # documents read since opening

    def _where(self) -> str:
        where = _describe(self.make_source)
        if self.read is None:
            return f"a document of {where} (batch row {self.slot} of {self.num_slots}, epoch {self.epoch})"
        return f"document {self.slot + self.read * self.num_slots} of {where}"

    def _next_document(self) -> str:
        """The next document's text; StopIteration at the end of the source."""
        try:
            doc = next(self.iterator)
        except StopIteration:
            raise
        except Exception as e:
            raise DataError(
                f"--{self.section}.dataset: cannot read {_describe(self.make_source)} ({one_line(e)}); fix"
                " or remove that record, or use another dataset"
            ) from e
        try:
            text = document_text(doc, self.text_field, self._where, self.section)
        except DocumentError as e:
            raise DataError(str(e)) from None
        if self.read is not None:
            self.read += 1
        return text

    def next_window(self) -> list[int]:
        empty_epochs = 0
        while len(self.buffer) < self.window:
            try:
                text = self._next_document()
                empty_epochs = 0
            except StopIteration:
                empty_epochs += 1
                if empty_epochs > 1:
                    raise DataError(
                        f"--{self.section}.dataset: {_describe(self.make_source)}: dataset slot {self.slot} of"
                        f" {self.num_slots} holds no documents: the dataset has fewer documents than the"
                        f" {self.num_slots} rows of a global batch; add documents or lower the batch size"
                    ) from None
                self.epoch += 1
                self._open()
                continue
            self.buffer.extend(self.tokenizer.encode(text))
        out, self.buffer = self.buffer[: self.window], self.buffer[self.window :]
        return out

    def state_dict(self) -> dict:
        return {"source": self.source.state_dict(), "buffer": list(self.buffer), "epoch": self.epoch}

    def load_state_dict(self, state: dict) -> None:
        self.buffer, self.epoch = list(state["buffer"]), state["epoch"]
        self._open(state["source"])


class PackedSlotDataset(IterableDataset, Stateful):
    """Yields (input_ids, labels) for slots [first_slot, first_slot + n_slots), cycling."""

    def __init__(
        self,
        make_source: Callable,
        tokenizer: Tokenizer,
        seq_len: int,
        first_slot: int,
        n_slots: int,
        num_slots: int,
        text_field: str = "text",
        section: str = "training",
    ):
        """`section`: the config section the dataset keys come from ("training" or
        "validation"), named in DataError messages."""
        self.make_source, self.tokenizer, self.seq_len = make_source, tokenizer, seq_len
        self.section = section
        self.slots = list(range(first_slot, first_slot + n_slots))
        self.num_slots, self.text_field = num_slots, text_field
        self._streams: dict[int, _SlotStream] | None = None
        self._pending: dict | None = None
        self.next_index = 0

    def _ensure_streams(self) -> dict[int, _SlotStream]:
        if self._streams is None:
            self._streams = {
                s: _SlotStream(self.make_source, s, self.num_slots, self.tokenizer, self.seq_len + 1, self.text_field,
                               self.section)
                for s in self.slots
            }
            if self._pending is not None:
                for s, state in self._pending.items():
                    self._streams[s].load_state_dict(state)
                self._pending = None
        return self._streams

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        streams = self._ensure_streams()
        while True:
            slot = self.slots[self.next_index]
            tokens = torch.tensor(streams[slot].next_window(), dtype=torch.long)
            self.next_index = (self.next_index + 1) % len(self.slots)
            yield tokens[:-1], tokens[1:]

    # State is keyed by global slot id, so another layout can pick out its own slots.
    def state_dict(self) -> dict:
        streams = self._ensure_streams()
        return {"next_index": self.next_index, "slots": {str(s): st.state_dict() for s, st in streams.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.next_index = state["next_index"]
        self._pending = {int(s): st for s, st in state["slots"].items() if int(s) in self.slots}
        self._streams = None
