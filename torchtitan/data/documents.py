"""Documents by (shard, index): the three kinds of source the slot streams read.

- `TokenFolder` (data/token_folder.py): a pre-tokenized folder, random access, no tokenizer work.
- `IndexedText`: random access to raw text: the embedded corpus, a local JSON Lines or text file
  (one document a line, blank lines skipped; the line starts are found by one scan of the file
  in the main process, numpy over 8 MiB blocks), a dataset saved by HF `save_to_disk` or an
  `.arrow` file (memory-mapped). Tokenised when read.
- `StreamedText`: any other HF source (hub names, Parquet / CSV / compressed files, data
  folders), streamed shard by shard (`IterableDataset.shard`), one reader per shard and epoch
  in this process. Documents of this process's slots passed on the way to another one's are
  kept until read (slots sharing a shard advance at their own pace).

Which dataset opens as which (and how the config check reads it): data/kinds.py. Every kind
counts the bytes it reads (`bytes_read`: file bytes for indexed and tokenized
sources, record text for streams), the measure of read amplification.
"""

from __future__ import annotations

import os

import numpy as np

from torchtitan.data.input_errors import input_fault
from torchtitan.data.line_files import line_starts, parse_line
from torchtitan.data.sources import DocumentError, document_text
from torchtitan.data.token_folder import TokenFolder, TruncatedShard
from torchtitan.messages import one_line


class DataError(RuntimeError):
    """A document the run cannot use (no text field, unreadable or truncated data), met past
    the first records the config check read. The message is one line naming the key."""


def _token_array(ids: list[int]) -> np.ndarray:
    return np.asarray(ids, dtype=np.int64)


class _RawText:
    """Text -> training tokens, with the one-line errors of a bad record."""

    def __init__(self, name: str, tokenizer, text_field: str, section: str):
        self.name, self.tokenizer, self.text_field, self.section = (
            name,
            tokenizer,
            text_field,
            section,
        )
        self.bytes_read = 0

    def _tokens(self, record, where) -> np.ndarray:
        try:
            text = document_text(record, self.text_field, where, self.section)
        except DocumentError as e:
            raise DataError(str(e)) from None
        return _token_array(self.tokenizer.encode(text))


class IndexedText(_RawText):
    kind = "indexed"
    num_shards = 1

    def __init__(
        self,
        name: str,
        tokenizer,
        text_field: str,
        section: str,
        *,
        texts=None,
        path: str = "",
        table=None,
    ):
        super().__init__(name, tokenizer, text_field, section)
        self.texts, self.path, self.table, self._fd = texts, path, table, None
        self.scanned = 0
        if path:
            self.starts, self.ends, self.scanned = line_starts(path)
            self.json = not path.endswith(".txt")
            self.size = len(self.starts)
        else:
            self.size = len(texts) if texts is not None else len(table)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_fd"] = None
        return state

    def shard_size(self, shard: int) -> int:
        return self.size

    def where(self, shard: int, index: int) -> str:
        return f"document {index} of {self.name}"

    def tokens(self, shard: int, index: int, epoch: int = 0) -> np.ndarray | None:
        if index >= self.size:
            return None
        if self.texts is not None:
            self.bytes_read += len(self.texts[index])
            return self._tokens(
                {self.text_field: self.texts[index]}, lambda: self.where(shard, index)
            )
        if self.table is not None:
            record = self.table[index]
            self.bytes_read += len(str(record.get(self.text_field, "")))
            return self._tokens(record, lambda: self.where(shard, index))
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        start, end = int(self.starts[index]), int(self.ends[index])
        raw = os.pread(self._fd, end - start, start)
        self.bytes_read += len(raw)
        if len(raw) != end - start:
            raise DataError(
                f"--{self.section}.dataset: '{self.path}' was truncated while training (document"
                f" {index} is gone); restore the file, then resume from the last checkpoint"
            )
        try:
            record = parse_line(raw, self.json)
        except ValueError as e:
            raise DataError(
                f"--{self.section}.dataset: {self.where(shard, index)} is not JSON ({one_line(e, 80)});"
                " fix or remove that line"
            ) from None
        return self._tokens(record, lambda: self.where(shard, index))


class _ShardReader:
    def __init__(self, iterator, start: int):
        self.iterator, self.pos, self.kept, self.done = iterator, start, {}, False


class StreamedText(_RawText):
    kind = "stream"

    def __init__(self, name: str, tokenizer, text_field: str, section: str, make_source):
        super().__init__(name, tokenizer, text_field, section)
        self.make_source = make_source
        self.num_shards = self._open().num_shards
        self.wanted: dict[
            int, set[tuple[int, int]]
        ] = {}  # shard -> (stride, offset) of this process's slots
        self._readers: dict[tuple[int, int], _ShardReader] = {}
        self._source = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_readers"], state["_source"] = {}, None
        return state

    def _open(self):
        try:
            return self.make_source()
        except Exception as e:
            if not input_fault(e):  # a bug of ours: its traceback
                raise
            raise DataError(
                f"--{self.section}.dataset: cannot open {self.name} ({one_line(e)}); check that it is"
                " still there and readable"
            ) from e

    def want(self, shard: int, stride: int, offset: int) -> None:
        self.wanted.setdefault(shard, set()).add((stride, offset))

    def shard_size(self, shard: int) -> None:
        return None

    def where(self, shard: int, index: int) -> str:
        return f"document {index} of shard {shard} of {self.name}"

    def _reader(self, shard: int, epoch: int, index: int) -> _ShardReader:
        r = self._readers.get((shard, epoch))
        if r is None or (r.pos > index and index not in r.kept):
            if self._source is None:
                self._source = self._open()
            part = (
                self._source.shard(num_shards=self.num_shards, index=shard)
                if self.num_shards > 1
                else self._source
            )
            if index:
                part = part.skip(index)  # a resume: HF re-parses the shard up to there
            r = self._readers[(shard, epoch)] = _ShardReader(iter(part), index)
        return r

    def tokens(self, shard: int, index: int, epoch: int = 0) -> np.ndarray | None:
        r = self._reader(shard, epoch, index)
        if index in r.kept:
            return self._tokens(r.kept.pop(index), lambda: self.where(shard, index))
        wanted = self.wanted.get(shard, ())
        while not r.done:
            try:
                record = next(r.iterator)
            except StopIteration:
                r.done = True
                break
            except Exception as e:
                if not input_fault(e):  # a bug of ours: its traceback
                    raise
                raise DataError(
                    f"--{self.section}.dataset: cannot read {self.name} ({one_line(e)}); fix or remove"
                    " that record, or use another dataset"
                ) from e
            pos, r.pos = r.pos, r.pos + 1
            text = record.get(self.text_field) if isinstance(record, dict) else None
            self.bytes_read += len(text) if isinstance(text, str) else 0
            if pos == index:
                return self._tokens(record, lambda: self.where(shard, index))
            if any(pos >= offset and (pos - offset) % stride == 0 for stride, offset in wanted):
                r.kept[pos] = record
        if not r.kept:
            del self._readers[(shard, epoch)]
        return None


def describe(dataset: str, split: str) -> str:
    return f"dataset '{dataset}' (split '{split}')"


__all__ = [
    "DataError",
    "IndexedText",
    "StreamedText",
    "TokenFolder",
    "TruncatedShard",
]
