"""How the pre-launch check reads each dataset kind (torch-free): the checks data/kinds.py's
table names, for every kind but the hub's (data/hub_check.py).

A dataset is opened the way the run opens it and only its first records are read: at most one
global batch of rows from a local file or folder. `datasets` is imported only for a kind that
needs it, so the default run ('pydoc') starts as fast as before. A fault of the input is one
ConfigError line that starts with the key, names the value and says how to fix it; any other
exception is a bug of ours and keeps its traceback (data/input_errors.py tells them apart).
"""

from __future__ import annotations

import ast
import itertools
import logging
import os
import re
import warnings
from dataclasses import dataclass
from functools import partial

from torchtitan.config.manager import ConfigError, suggest
from torchtitan.data.input_errors import input_fault
from torchtitan.data.line_files import first_records
from torchtitan.data.sources import (
    LOCAL_FILE_BUILDERS,
    DatasetKeys,
    DocumentError,
    document_text,
    read_table,
    stream_file,
)
from torchtitan.messages import one_line

LOCAL_KINDS = "/".join(LOCAL_FILE_BUILDERS)  # the local files we read, as messages list them


@dataclass(frozen=True)
class DatasetCheck:
    """What a kind's check is given: the dataset's keys, the rows of a global batch (each
    reads its own documents), whether this is a dry run (which reads no data), and the
    tokenizer the run will load."""

    keys: DatasetKeys
    rows: int
    dry_run: bool = False
    tokenizer_path: str = ""


# --------------------------------------------------------------------------- before opening


def refuse_missing_local(dataset: str, section: str) -> None:
    """A name that is no local dataset but looks like a path (the hub kind's path check)."""
    looks_local = (
        dataset.startswith((".", "/", "~"))
        or dataset.endswith(tuple(LOCAL_FILE_BUILDERS))
        or os.path.exists(dataset)
    )
    if looks_local and not os.path.exists(os.path.expanduser(dataset)):
        raise ConfigError(
            f"--{section}.dataset: local dataset path '{dataset}' does not exist; give an existing"
            f" {LOCAL_KINDS} file or folder, 'pydoc', or an HF hub name"
        )


def refuse_unknown_file(dataset: str, section: str) -> None:
    """A local file of an extension no builder reads (the local file kind's path check)."""
    if os.path.splitext(os.path.expanduser(dataset))[1] not in LOCAL_FILE_BUILDERS:
        raise ConfigError(
            f"--{section}.dataset: cannot read '{dataset}': use a {LOCAL_KINDS} file or a folder"
        )


# --------------------------------------------------------------------------- shared


def too_few(k: DatasetKeys, n: int, rows: int) -> str:
    return (
        f"--{k.section}.dataset={k.dataset!r}: split '{k.split}' has {n} document{'s' if n != 1 else ''},"
        f" fewer than the {rows} rows of a global batch (every row reads its own documents); add documents,"
        " or lower --training.local_batch_size (or --training.global_batch_size)"
    )


def no_config_name(k: DatasetKeys, what: str) -> None:
    """dataset_config_name picks a subset of a hub dataset: on any other kind it is a mistake."""
    if k.config_name:
        raise ConfigError(
            f"--{k.section}.dataset_config_name={k.config_name!r} has no effect on {what} (it picks a"
            " subset of a hub dataset); drop it"
        )


def check_text(k: DatasetKeys, records: list) -> None:
    """Every record holds its text where the run reads it (data/sources.document_text)."""
    for i, record in enumerate(records):
        try:
            document_text(record, k.text_field, f"document {i} of '{k.dataset}'", k.section)
        except DocumentError as e:
            raise ConfigError(str(e)) from None


def listed(message: str, marker: str) -> str:
    """The Python list printed after `marker` in a datasets error message, as 'a, b'."""
    found = re.search(re.escape(marker) + r"\s*(\[[^\]]*\])", message)
    if not found:
        return ""
    try:
        return ", ".join(str(x) for x in ast.literal_eval(found.group(1)))
    except (ValueError, SyntaxError):
        return found.group(1)


def first_streamed(stream, keys: DatasetKeys, limit: int) -> list:
    """The first `limit` records of the HF stream `stream(keys)` (data/sources.py), as the run
    opens it."""
    try:
        return list(itertools.islice(stream(keys), limit))
    except StopIteration:  # raised by some builders for an empty file, inside a generator frame
        return []


class QuietHF:
    """Silences `datasets` and `huggingface_hub` (log lines, warnings, progress bars) while a
    dataset is opened, so a failure prints only our one line. `restore()` undoes it; a check
    that gives up on a hung hub thread leaves it silenced (the process is about to exit)."""

    def __init__(self):
        import sys

        import datasets  # configures its loggers; we override them after

        # An IterableDataset imports torch to share a counter with loader workers (~2 s, and the
        # check is torch-free); skip that unless torch is already there (inside a worker).
        self.config = datasets.config
        self.torch = self.config.TORCH_AVAILABLE
        if "torch" not in sys.modules:
            self.config.TORCH_AVAILABLE = False
        self.loggers = [
            logging.getLogger(n) for n in ("datasets", "huggingface_hub", "fsspec", "filelock")
        ]
        self.levels = [lg.level for lg in self.loggers]
        for lg in self.loggers:
            lg.setLevel(logging.CRITICAL + 1)
        self.warnings = warnings.catch_warnings()
        self.warnings.__enter__()
        warnings.simplefilter("ignore")
        from datasets.utils import logging as ds_logging

        self.bars = ds_logging.is_progress_bar_enabled()
        ds_logging.disable_progress_bar()

    def restore(self) -> None:
        from datasets.utils import logging as ds_logging

        if self.bars:
            ds_logging.enable_progress_bar()
        self.warnings.__exit__(None, None, None)
        self.config.TORCH_AVAILABLE = self.torch
        for lg, level in zip(self.loggers, self.levels):
            lg.setLevel(level)


# --------------------------------------------------------------------------- the embedded corpus


def check_pydoc(c: DatasetCheck) -> None:
    from torchtitan.data.corpus import PYDOC_SPLITS, pydoc_documents

    k = c.keys
    no_config_name(k, "the embedded 'pydoc' dataset")
    if k.split not in PYDOC_SPLITS:
        raise ConfigError(
            f"--{k.section}.dataset_split={k.split!r}: the embedded 'pydoc' dataset has the splits"
            f" {', '.join(PYDOC_SPLITS)}{suggest(k.split, PYDOC_SPLITS)}; set --{k.section}.dataset_split=train"
            " (or validation, the held-out docstrings)"
        )
    if k.text_field != "text":
        raise ConfigError(
            f"--{k.section}.dataset_text_field={k.text_field!r}: the embedded 'pydoc' dataset has only the"
            f" column text; set --{k.section}.dataset_text_field=text"
        )
    if c.dry_run:
        return
    n = len(pydoc_documents(k.split))
    if n < c.rows:
        raise ConfigError(too_few(k, n, c.rows))


# --------------------------------------------------------------------------- pre-tokenized folders


def check_token_folder(c: DatasetCheck) -> None:
    """Every file the manifest names, at its size; the run's tokenizer; a document for every row."""
    from torchtitan.data.slots import empty_slot
    from torchtitan.data.token_folder import FolderError, check_folder
    from torchtitan.data.tokenizer import load_tokenizer

    if c.dry_run:
        return
    k = c.keys
    try:
        manifest = check_folder(k.dataset, load_tokenizer(c.tokenizer_path).fingerprint)
    except FolderError as e:
        raise ConfigError(f"--{k.section}.dataset: {e}") from None
    slot = empty_slot(manifest["source_shards"], c.rows)
    if slot is not None:
        raise ConfigError(
            f"--{k.section}.dataset={k.dataset!r}: global batch row {slot} of {c.rows} gets no document"
            f" ({manifest['docs']} documents in {len(manifest['source_shards'])} source shard(s)); add"
            " documents, or lower --training.local_batch_size (or --training.global_batch_size)"
        )


# --------------------------------------------------------------------------- local files and folders


def _check_local(c: DatasetCheck, read) -> None:
    """A local dataset: `read(keys, rows, is_file)` gives its first records as the run reads
    them (a ConfigError for a fault of the input)."""
    k = c.keys
    no_config_name(k, f"the local dataset '{k.dataset}'")
    if c.dry_run:
        return
    is_file = os.path.isfile(k.path)
    if is_file and k.split != "train":
        raise ConfigError(
            f"--{k.section}.dataset_split={k.split!r}: the local file '{k.dataset}' has only the split"
            f" 'train'; set --{k.section}.dataset_split=train"
        )
    records = read(k, c.rows, is_file)
    if not records:
        empty = " (the file is empty)" if is_file and os.path.getsize(k.path) == 0 else ""
        raise ConfigError(
            f"--{k.section}.dataset={k.dataset!r}: no documents in split '{k.split}'{empty}; give a"
            " dataset with documents"
        )
    check_text(k, records)
    if len(records) < c.rows:
        raise ConfigError(too_few(k, len(records), c.rows))


def _local_error(k: DatasetKeys, is_file: bool, e: BaseException, ours: bool = False) -> str:
    msg = one_line(e)
    if msg.startswith("Bad split"):
        have = listed(msg, "Available splits:")
        return (
            f"--{k.section}.dataset_split={k.split!r}: the local folder '{k.dataset}' has only the split(s)"
            f" {have} (one per file name: train.jsonl, validation.jsonl, ...){suggest(k.split, have.split(', '))};"
            f" set --{k.section}.dataset_split to one of them"
        )
    if type(e).__name__ == "EmptyDatasetError":
        return (
            f"--{k.section}.dataset={k.dataset!r}: the folder holds no data files (looked for {LOCAL_KINDS});"
            " put the data files in it or give one file"
        )
    what = "file" if is_file else "folder"
    reason = msg if ours or type(e).__name__ in msg else f"{type(e).__name__}: {msg}"
    return (
        f"--{k.section}.dataset={k.dataset!r}: cannot read the local {what} ({reason}); fix the data (its"
        f" first records are read as the run reads them) or give another {LOCAL_KINDS} file or folder"
    )


def _read_lines(k: DatasetKeys, rows: int, is_file: bool) -> list:
    """A file read by its line index in the run: its lines parsed the same way."""
    try:
        return first_records(k.path, rows)
    except ValueError as e:  # our own parse: its message names the line
        raise ConfigError(_local_error(k, is_file, e, ours=True)) from None
    except OSError as e:
        raise ConfigError(_local_error(k, is_file, e)) from None


def hf_reader(first):
    """A reader for _check_local of a kind read with HF datasets: `first(keys, rows)` gives
    the records, read quietly."""

    def read(k: DatasetKeys, rows: int, is_file: bool) -> list:
        quiet = QuietHF()
        try:
            return first(k, rows)
        except StopIteration:  # json: an empty file
            return []
        except Exception as e:
            if not input_fault(e):  # a bug of ours: its traceback
                raise
            raise ConfigError(_local_error(k, is_file, e)) from None
        finally:
            quiet.restore()

    return read


def _first_rows(k: DatasetKeys, limit: int) -> list:
    table = read_table(k)
    return [table[i] for i in range(min(limit, len(table)))]


_read_table = hf_reader(_first_rows)
_read_file_stream = hf_reader(partial(first_streamed, stream_file))


def _read_file(k: DatasetKeys, rows: int, is_file: bool) -> list:
    refuse_unknown_file(k.dataset, k.section)  # the path check, for a check run without it
    return _read_file_stream(k, rows, is_file)


def check_lines(c: DatasetCheck) -> None:
    _check_local(c, _read_lines)


def check_table(c: DatasetCheck) -> None:
    _check_local(c, _read_table)


def check_file(c: DatasetCheck) -> None:
    _check_local(c, _read_file)


def streamed_check(stream):
    """The check of a local kind read as the HF stream `stream(keys)` (data/sources.py)."""
    read = hf_reader(partial(first_streamed, stream))

    def check(c: DatasetCheck) -> None:
        _check_local(c, read)

    return check
