"""Datasets known by a name, as upstream torchtitan names them (its TOMLs say
`dataset = "c4_test"`, `validation.dataset = "c4_validation"`), torch-free.

A name stands for a location, a split and a hub config: `resolve` turns the keys of a named
dataset into the keys of what is read there, which the other kinds of data/kinds.py then
open and check as if they had been given. `[section] dataset_path` (upstream's key: "path to
the dataset in the file system; if None, the default location") replaces the location.

- c4_test: tests/assets/c4_test/data.json, ~2,000 documents in JSON Lines. Upstream's are a
  sample of C4; ours are the paragraphs of Python's documentation topics (scripts/make_c4_test.py),
  so the tests need no network. Found from the current directory, as upstream's relative path
  is, else from the repository root.
- c4, c4_validation: the hub dataset allenai/c4, config "en", split train / validation, streamed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from torchtitan.config.manager import ConfigError
from torchtitan.data.sources import DatasetKeys

# The repository root: where tests/assets/ is when torchtitan runs from a checkout.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass(frozen=True)
class NamedDataset:
    """What one name stands for."""

    location: str  # a hub name, or a local path relative to the current directory / REPO_ROOT
    split: str  # the split read, whatever [section] dataset_split says (the name picks it)
    config_name: str = ""  # the hub config, unless [section] dataset_config_name picks another
    local: bool = False  # location is a path shipped with the repository
    about: str = ""  # for messages


NAMED: dict[str, NamedDataset] = {
    "c4_test": NamedDataset(
        os.path.join("tests", "assets", "c4_test", "data.json"),
        "train",
        local=True,
        about="the bundled 2K-document sample",
    ),
    "c4": NamedDataset("allenai/c4", "train", "en", about="allenai/c4 (en) on the hub"),
    "c4_validation": NamedDataset(
        "allenai/c4", "validation", "en", about="allenai/c4 (en) validation on the hub"
    ),
}

OFFLINE_NAME = "c4_test"  # what a hub name's error offers instead


def is_named(dataset: str) -> bool:
    return dataset in NAMED


def _local(path: str) -> bool:
    return os.path.exists(os.path.expanduser(path))


def shipped_path(named: NamedDataset) -> str:
    """A shipped location found from the current directory, else from REPO_ROOT ("" if neither)."""
    for base in (os.getcwd(), REPO_ROOT):
        path = os.path.join(base, named.location)
        if os.path.exists(path):
            return path
    return ""


def resolve(keys: DatasetKeys, dataset_path: str = "") -> DatasetKeys:
    """The keys of what the named dataset `keys.dataset` reads (ConfigError when it cannot be
    found). `dataset_path` replaces the default location; a local one drops the hub config
    (a local copy is read as the files it holds)."""
    named, section = NAMED[keys.dataset], keys.section
    config = keys.config_name or named.config_name
    if dataset_path:
        if (named.local or dataset_path.startswith((".", "/", "~"))) and not _local(dataset_path):
            raise ConfigError(
                f"--{section}.dataset_path={dataset_path!r}: no such file or folder (the location of"
                f" the named dataset '{keys.dataset}'); give an existing path, or leave it empty for"
                f" {named.about}"
            )
        location = dataset_path
        config = "" if _local(dataset_path) else config
    elif named.local:
        location = shipped_path(named)
        if not location:
            raise ConfigError(
                f"--{section}.dataset={keys.dataset!r}: {named.location} is found neither in the"
                f" current directory nor in the repository root ({REPO_ROOT}); run from the"
                f" repository, or give --{section}.dataset_path (the file or folder of its documents)"
            )
        config = ""
    else:
        location = named.location
    return replace(keys, dataset=location, split=named.split, config_name=config)


def rename(message: str, keys: DatasetKeys, resolved: DatasetKeys) -> str:
    """A message about the resolved keys, told about the name the user gave: its key shows
    the name (and where it points), and a hub name offers the bundled sample."""
    name = f"--{keys.section}.dataset={keys.dataset!r} ({resolved.dataset})"
    message = message.replace(f"--{keys.section}.dataset={resolved.dataset!r}", name)
    message = message.replace(f"--{keys.section}.dataset: ", f"{name}: ")
    if not NAMED[keys.dataset].local and not _local(resolved.dataset):
        offline = (
            f"--{keys.section}.dataset={OFFLINE_NAME} ({NAMED[OFFLINE_NAME].about}, no network)"
        )
        message = message.replace("or use a local file or 'pydoc'", f"or use {offline}")
        if offline not in message:
            message = f"{message.rstrip('. ')}; offline, use {offline}"
    return message
