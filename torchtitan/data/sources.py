"""Where documents come from, torch-free: the keys of one dataset, the HF readers of the kinds
read with HF datasets, and what a document's text is. The pre-launch data check and the run's
datasets both call these, so the check reads the data exactly as the run will.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from torchtitan.config.manager import suggest
from torchtitan.messages import one_line

# Local data files we stream with HF datasets: extension -> datasets builder name.
LOCAL_FILE_BUILDERS = {
    ".json": "json",
    ".jsonl": "json",
    ".parquet": "parquet",
    ".txt": "text",
    ".csv": "csv",
    ".arrow": "arrow",
}


@dataclass(frozen=True)
class DatasetKeys:
    """One dataset as a [training] or [validation] section names it (or a mixture's source)."""

    dataset: str
    split: str
    config_name: str = ""
    text_field: str = "text"
    section: str = "training"
    dataset_path: str = (
        ""  # [section] dataset_path: the location of a named dataset (data/named.py)
    )

    @property
    def path(self) -> str:
        return os.path.expanduser(self.dataset)


# The HF streams of the kinds read with HF datasets (data/kinds.py says which kind is which).


def stream_file(keys: DatasetKeys):
    """A local data file, by its extension's builder (its one split is 'train')."""
    import datasets

    builder = LOCAL_FILE_BUILDERS[os.path.splitext(keys.path)[1]]
    return datasets.load_dataset(builder, data_files=keys.path, split=keys.split, streaming=True)


def stream_folder(keys: DatasetKeys):
    """A local folder of data files, one split per file name."""
    import datasets

    return datasets.load_dataset(keys.path, split=keys.split, streaming=True)


def stream_hub(keys: DatasetKeys):
    import datasets

    return datasets.load_dataset(
        keys.dataset, keys.config_name or None, split=keys.split, streaming=True
    )


def read_table(keys: DatasetKeys):
    """A memory-mapped HF table: an `.arrow` file, or a folder written by `save_to_disk`."""
    import datasets

    path = keys.path
    table = (
        datasets.Dataset.from_file(path) if os.path.isfile(path) else datasets.load_from_disk(path)
    )
    return table[keys.split] if isinstance(table, datasets.DatasetDict) else table


def per_source_split(dataset: str, split: str) -> str:
    """The split a [validation] per_source set reads: a local file has only 'train', whatever
    [validation] dataset_split says (it names the split of the main validation dataset)."""
    return "train" if os.path.isfile(os.path.expanduser(dataset)) else split


class DocumentError(ValueError):
    """A record without usable text; the message is one line naming the key and the fix."""


def document_text(record, field: str, where, section: str = "training") -> str:
    """The text of `record` under `field` (the [section] dataset_text_field); DocumentError
    when the record has no such column or holds no string there. `where` names the document
    ("document 3 of 'data.jsonl'"), or is a function that does (called on an error only)."""
    if isinstance(record, dict) and isinstance(record.get(field), str):
        return record[field]
    where = where() if callable(where) else where
    key = f"--{section}.dataset_text_field={field!r}"
    if not isinstance(record, dict) or field not in record:
        columns = list(record) if isinstance(record, dict) else []
        raise DocumentError(
            f"{key}: {where} has no such column{suggest(field, columns)}; its columns are:"
            f" {', '.join(columns) or 'none'}; set --{section}.dataset_text_field to the one holding"
            " the document text"
        )
    text = record[field]
    what = (
        "has no text (null or missing)"
        if text is None
        else (f"holds {type(text).__name__} {one_line(repr(text), 40)}, not a string")
    )
    raise DocumentError(
        f"{key}: {where} {what}; set --{section}.dataset_text_field to the column holding the text, or fix"
        " that record"
    )
