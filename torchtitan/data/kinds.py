"""The dataset kinds, one table. Each entry says how a `[training] dataset` (a mixture's source,
a validation set) is recognised, how the run opens it, and how the pre-launch check reads it;
the run (open_documents), the config check (checks/data.py: check_dataset, check_dataset_path)
and scripts/tokenize_dataset.py all ask `kind_of`. A new kind is one entry here.

Torch- and numpy-free (the config check imports it): the openers import the readers inside.
A mixture is no kind: each of its sources is one of these.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from torchtitan.config.manager import ConfigError
from torchtitan.data.dataset_checks import (
    DatasetCheck,
    check_file,
    check_lines,
    check_pydoc,
    check_table,
    check_token_folder,
    refuse_missing_local,
    refuse_unknown_file,
    streamed_check,
)
from torchtitan.data.hub_check import check_hub
from torchtitan.data.line_files import is_indexed_file
from torchtitan.data.named import is_named, rename, resolve
from torchtitan.data.sources import (
    DatasetKeys,
    read_table,
    stream_file,
    stream_folder,
    stream_hub,
)
from torchtitan.data.token_folder import (
    FolderError,
    TokenFolder,
    check_folder,
    is_token_folder,
    read_manifest,
)
from torchtitan.messages import one_line


@dataclass
class DatasetKind:
    """One entry of KINDS (a plain dataclass: a test may swap an entry's function)."""

    name: str
    detect: Callable[[str], bool]  # the dataset key -> is it of this kind? (tried in table order)
    open: Callable[[DatasetKeys, Any], Any]  # (keys, tokenizer) -> the documents the run reads
    check: Callable[[DatasetCheck], None]  # reads what the run will read; ConfigError if bad
    # (dataset, section) -> ConfigError for a path it cannot be, before anything is opened
    path_check: Callable[[str, str], None] | None = None
    # dataset -> how its stored documents are delimited (bos_id, eos_id, has_bos), for kinds
    # tokenized ahead of the run (a mixture's sources must agree); None: the run's tokenizer
    delimiters: Callable[[str], tuple | None] | None = None


# How each kind opens: (keys, tokenizer) -> the documents (data/documents.py, imported here
# and not at the top: it needs numpy, which the config check does not).


def open_pydoc(keys: DatasetKeys, tokenizer):
    from torchtitan.data.corpus import pydoc_documents
    from torchtitan.data.documents import IndexedText, describe

    name = describe(keys.dataset, keys.split)
    return IndexedText(name, tokenizer, "text", keys.section, texts=pydoc_documents(keys.split))


def open_token_folder(keys: DatasetKeys, tokenizer):
    from torchtitan.data.documents import DataError

    try:
        return TokenFolder(keys.path, check_folder(keys.path, tokenizer.fingerprint))
    except ValueError as e:
        raise DataError(f"--{keys.section}.dataset: {one_line(e, 400)}") from None


def open_lines(keys: DatasetKeys, tokenizer):
    from torchtitan.data.documents import IndexedText, describe

    field = "text" if keys.path.endswith(".txt") else keys.text_field
    name = describe(keys.dataset, keys.split)
    return IndexedText(name, tokenizer, field, keys.section, path=keys.path)


def open_table(keys: DatasetKeys, tokenizer):
    from torchtitan.data.documents import IndexedText, describe

    name = describe(keys.dataset, keys.split)
    return IndexedText(name, tokenizer, keys.text_field, keys.section, table=read_table(keys))


def streamed(stream):
    """The opener of a kind read as the HF stream `stream(keys)` (data/sources.py)."""

    def open_stream(keys: DatasetKeys, tokenizer):
        from torchtitan.data.documents import StreamedText, describe

        name = describe(keys.dataset, keys.split)
        return StreamedText(name, tokenizer, keys.text_field, keys.section, partial(stream, keys))

    return open_stream


def _folder_delimiters(dataset: str) -> tuple | None:
    """A token folder's document delimiters from its manifest (None: unreadable, which
    check_token_folder reports)."""
    try:
        tk = read_manifest(dataset)["tokenizer"]
    except FolderError:
        return None
    return tk.get("bos_id"), tk.get("eos_id"), tk.get("has_bos")


def dataset_path_of(keys: DatasetKeys) -> str:
    """[section] dataset_path as the keys carry it ("": the named dataset's default place)."""
    return keys.dataset_path


def open_named(keys: DatasetKeys, tokenizer):
    """A named dataset (data/named.py): opened as the kind of what its name stands for."""
    from torchtitan.data.documents import DataError

    try:
        resolved = resolve(keys, dataset_path_of(keys))
    except ValueError as e:
        raise DataError(str(e)) from None
    return kind_of(resolved.dataset).open(resolved, tokenizer)


def check_named(c: DatasetCheck) -> None:
    """A named dataset is checked as what it stands for; its messages name the name (and a hub
    name's offer the bundled sample, which needs no network)."""
    resolved = resolve(c.keys, dataset_path_of(c.keys))
    kind = kind_of(resolved.dataset)
    try:
        if kind.path_check is not None:
            kind.path_check(resolved.dataset, resolved.section)
        kind.check(replace(c, keys=resolved))
    except ConfigError as e:
        raise ConfigError(rename(str(e), c.keys, resolved)) from None


def _file(dataset: str) -> bool:
    return os.path.isfile(os.path.expanduser(dataset))


KINDS: list[DatasetKind] = [
    # upstream's names (c4_test, c4, c4_validation): what each stands for, as its own kind
    DatasetKind("named", is_named, open_named, check_named),
    DatasetKind("pydoc", lambda d: d == "pydoc", open_pydoc, check_pydoc),
    DatasetKind(  # scripts/tokenize_dataset.py's folders: random access, no tokenizer work
        "tokens",
        lambda d: os.path.isdir(os.path.expanduser(d)) and is_token_folder(d),
        open_token_folder,
        check_token_folder,
        delimiters=_folder_delimiters,
    ),
    DatasetKind(  # .txt, JSON Lines: random access by a line index
        "lines", lambda d: is_indexed_file(os.path.expanduser(d)), open_lines, check_lines
    ),
    DatasetKind("arrow", lambda d: _file(d) and d.endswith(".arrow"), open_table, check_table),
    DatasetKind(  # a folder written by HF save_to_disk: memory-mapped, like an .arrow file
        "saved",
        lambda d: os.path.isfile(os.path.join(os.path.expanduser(d), "state.json")),
        open_table,
        check_table,
    ),
    DatasetKind(  # any other local file: an HF stream by its extension's builder
        "file", _file, streamed(stream_file), check_file, refuse_unknown_file
    ),
    DatasetKind(  # a folder of data files, one split per file name
        "folder",
        lambda d: os.path.isdir(os.path.expanduser(d)),
        streamed(stream_folder),
        streamed_check(stream_folder),
    ),
    DatasetKind(  # anything else names a hub dataset (or a local path that is not there)
        "hub", lambda d: True, streamed(stream_hub), check_hub, refuse_missing_local
    ),
]


def kind_of(dataset: str) -> DatasetKind:
    """The first kind of the table whose detect() takes `dataset` (the hub's takes any)."""
    return next(k for k in KINDS if k.detect(dataset))


def dataset_kind(name: str) -> DatasetKind:
    """The table's entry called `name`."""
    return next(k for k in KINDS if k.name == name)


def open_documents(
    dataset: str,
    split: str,
    config_name: str,
    text_field: str,
    tokenizer,
    *,
    section: str = "training",
    dataset_path: str = "",
):
    """The documents of `dataset` as the slot streams read them (data/documents.py).
    `dataset_path`: [section] dataset_path, the location of a named dataset (data/named.py)."""
    keys = DatasetKeys(dataset, split, config_name, text_field, section)
    if dataset_path:
        keys = replace(keys, dataset_path=dataset_path)
    return kind_of(dataset).open(keys, tokenizer)
