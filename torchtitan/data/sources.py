"""Where documents come from, torch-free: how a dataset key is opened and what a document's
text is. The pre-launch data check and the run's datasets both call these, so the check reads
the data exactly as the run will.
"""

from __future__ import annotations

import os

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


def open_source(dataset: str, split: str, config_name: str = ""):
    """A streaming HF IterableDataset of `dataset`: 'pydoc' (embedded), a local file (by its
    extension's builder), a local folder (one split per file name), or a hub name."""
    import datasets

    if dataset == "pydoc":
        from torchtitan.data.corpus import pydoc_documents

        return datasets.Dataset.from_dict({"text": pydoc_documents(split)}).to_iterable_dataset()
    path = os.path.expanduser(dataset)
    if os.path.isfile(path):
        builder = LOCAL_FILE_BUILDERS[os.path.splitext(path)[1]]
        return datasets.load_dataset(builder, data_files=path, split=split, streaming=True)
    if os.path.isdir(path):
        return datasets.load_dataset(path, split=split, streaming=True)
    return datasets.load_dataset(dataset, config_name or None, split=split, streaming=True)


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
