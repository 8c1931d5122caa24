"""Tokenizer and dataset checks that read the inputs (torch-free), run before any process group.

The tokenizer is loaded as the run loads it (once per process: data/tokenizer.load_tokenizer). A dataset is opened the way the run
opens it (HF `datasets`, streaming) and only its first records are read: at most one global
batch of rows from a local file or folder, one record from the hub (within HUB_TIMEOUT_S).
`datasets` is imported only for a dataset other than the embedded 'pydoc', so the default run
starts as fast as before. Every problem is one ConfigError line that starts with the key,
names the value and says how to fix it.
"""

import ast
import itertools
import logging
import os
import re
import threading
import warnings

from torchtitan.config.job_config import JobConfig
from torchtitan.config.manager import ConfigError, suggest
from torchtitan.messages import one_line

HUB_TIMEOUT_S = 60.0  # how long the hub may take to give the first record of a dataset
_OTHER_SOURCE = "or use a local file or 'pydoc'"
_TOKENIZER_FIX = "give the tokenizer.json of a Hugging Face tokenizer (or its folder), or leave it empty for the bundled tokenizer"


def check_data_inputs(cfg: JobConfig, args, global_batch: int = 0) -> None:
    """Tokenizer, training dataset and (when validation is enabled) validation dataset.

    `args`: the flavor's model args (vocab_size 0 = take the tokenizer's). `global_batch`: rows
    per optimizer step over all data-parallel ranks (0: that of one data-parallel rank)."""
    from torchtitan.distributed.job_shape import global_batch as rows_per_step

    rows = global_batch or rows_per_step(cfg, 1)
    check_tokenizer(cfg, args)
    for name in training_datasets(cfg.training):
        in_mix(name, cfg.training, lambda name=name: check_dataset(cfg, "training", rows, name))
    check_mix_delimiters(cfg.training)
    if cfg.validation.enable:
        check_dataset(cfg, "validation", rows)
        for name in validation_sets(cfg.validation):
            in_entry(
                name,
                "validation",
                "per_source",
                lambda name=name: check_dataset(cfg, "validation", rows, name, True),
            )


def validation_sets(v) -> list[str]:
    """The datasets of [validation] per_source (data/validation.per_source_sets' rule)."""
    out = []
    for entry in v.per_source:
        name, sep, dataset = entry.partition("=")
        out.append(entry if not sep or os.path.exists(os.path.expanduser(entry)) else dataset)
    return out


def training_datasets(t) -> list[str]:
    """The training datasets: the mixture's sources, or the one dataset; [training] loader keys checked."""
    from torchtitan.data.mixture import MixError, parse_mix

    if t.dataloader_workers != "auto" and (
        not isinstance(t.dataloader_workers, int) or t.dataloader_workers < 0
    ):
        raise ConfigError(
            f"--training.dataloader_workers={t.dataloader_workers}: must be >= 0 (0: read on the"
            " training thread) or auto"
        )
    if not t.dataset_mix:
        return [t.dataset]
    if t.dataset != "pydoc":
        raise ConfigError(
            f"--training.dataset={t.dataset!r} and --training.dataset_mix are both set; give the"
            f" dataset as a mixture entry ('{t.dataset}:1.0') or drop dataset_mix"
        )
    try:
        return [s.dataset for s in parse_mix(t.dataset_mix)]
    except MixError as e:
        raise ConfigError(f"--training.dataset_mix: {e}") from None


def in_mix(name: str, t, check) -> None:
    """Run a dataset check; for a mixture's source, its error names the entry instead of the key."""
    if not t.dataset_mix:
        return check()
    in_entry(name, "training", "dataset_mix", check)


def in_entry(name: str, section: str, key: str, check) -> None:
    """Run a check of one entry of the list `[section] key`; an error about [section] dataset
    names the entry instead."""
    try:
        check()
    except ConfigError as e:
        msg, head = str(e), f"--{section}.dataset"
        if not re.match(re.escape(head) + r"[=: ]", msg):
            raise
        raise ConfigError(
            f"--{section}.{key} entry {name!r}" + msg[len(head) :].removeprefix("=" + repr(name))
        ) from None


def check_mix_delimiters(t) -> None:
    """The pre-tokenized sources of a mixture must delimit documents alike (same BOS/EOS)."""
    from torchtitan.data.token_folder import FolderError, is_token_folder, read_manifest

    seen = {}
    for name in training_datasets(t) if t.dataset_mix else []:
        if is_token_folder(name):
            try:
                tk = read_manifest(name)["tokenizer"]
            except FolderError:
                continue  # check_dataset said it
            seen[name] = (tk.get("bos_id"), tk.get("eos_id"), tk.get("has_bos"))
    if len(set(seen.values())) > 1:
        parts = ", ".join(f"'{n}' BOS {b} EOS {e}" for n, (b, e, _) in seen.items())
        raise ConfigError(
            f"--training.dataset_mix: its pre-tokenized sources delimit documents differently ({parts});"
            " tokenize every source with the run's tokenizer"
        )


def check_dataset_path(dataset: str, section: str = "training") -> None:
    """A [section] dataset that names a local path must exist and be a readable kind (before
    anything is opened)."""
    from torchtitan.data.sources import LOCAL_FILE_BUILDERS

    if dataset == "pydoc":
        return
    looks_local = (
        dataset.startswith((".", "/", "~"))
        or dataset.endswith(tuple(LOCAL_FILE_BUILDERS))
        or os.path.exists(dataset)
    )
    kinds = "/".join(LOCAL_FILE_BUILDERS)
    path = os.path.expanduser(dataset)
    if looks_local and not os.path.exists(path):
        raise ConfigError(
            f"--{section}.dataset: local dataset path '{dataset}' does not exist; give an existing"
            f" {kinds} file or folder, 'pydoc', or an HF hub name"
        )
    if os.path.isfile(path) and os.path.splitext(path)[1] not in LOCAL_FILE_BUILDERS:
        raise ConfigError(
            f"--{section}.dataset: cannot read '{dataset}': use a {kinds} file or a folder"
        )


# --------------------------------------------------------------------------- tokenizer


def check_tokenizer(cfg: JobConfig, args) -> None:
    """Loads the tokenizer as the run will; its size must fit a flavor's fixed vocab_size. A dry
    run of such a flavor reads no tokenizer, so neither does its check."""
    if cfg.job.dry_run and args.vocab_size:
        return
    from torchtitan.data.tokenizer import TokenizerError, load_tokenizer

    m = cfg.model
    if m.tokenizer_path:
        full = os.path.expanduser(m.tokenizer_path)
        if os.path.isdir(full):
            full = os.path.join(full, "tokenizer.json")
        if not os.path.isfile(full):
            raise ConfigError(
                f"--model.tokenizer_path: '{full}' not found; give an HF tokenizer.json file (or its"
                " folder), or leave it empty for the bundled tokenizer"
            )
    key = f"--model.tokenizer_path={m.tokenizer_path!r}"
    try:
        tokenizer = load_tokenizer(m.tokenizer_path)
    except TokenizerError as e:
        where = "" if e.path == os.path.expanduser(m.tokenizer_path) else f" ('{e.path}')"
        if e.kind == "no_bos_eos":
            raise ConfigError(
                f"{key}: the tokenizer{where} has {e.reason}; use a tokenizer that defines one of these"
                " pairs (as tokens or added tokens)"
            ) from None
        raise ConfigError(
            f"{key}: not an HF tokenizer.json{where}: {e.reason}; {_TOKENIZER_FIX}"
        ) from None
    if args.vocab_size and tokenizer.vocab_size > args.vocab_size:
        from torchtitan.models.flavors import flavors_of

        open_flavors = [f for f, a in flavors_of(m.name).items() if not a.vocab_size]
        other = f" (here: {', '.join(open_flavors)})" if open_flavors else ""
        raise ConfigError(
            f"{key}: the tokenizer has {tokenizer.vocab_size} tokens but {m.name} {m.flavor} has only"
            f" {args.vocab_size} embeddings (its fixed vocab_size); use the flavor's own tokenizer, or a"
            f" flavor with vocab_size 0, which takes the tokenizer's{other}"
        )


# --------------------------------------------------------------------------- datasets


def check_dataset(
    cfg: JobConfig, section: str, rows: int, name: str = "", per_source: bool = False
) -> None:
    """The [training] or [validation] dataset keys (`name`: a mixture's source instead of the
    dataset key). A dry run reads no data: it checks only what needs no reading (the 'pydoc'
    split, a config name that has no effect)."""
    from torchtitan.data.token_folder import is_token_folder

    src = getattr(cfg, section)
    split, field, config = src.dataset_split, src.dataset_text_field, src.dataset_config_name
    name = name or src.dataset
    if per_source:
        from torchtitan.data.sources import per_source_split

        split = per_source_split(name, split)
    path = os.path.expanduser(name)
    if os.path.isdir(path) and is_token_folder(path):
        if not cfg.job.dry_run:
            _check_token_folder(cfg, section, name, rows)
        return
    local = name == "pydoc" or os.path.exists(path)
    if config and local:
        what = "the embedded 'pydoc' dataset" if name == "pydoc" else f"the local dataset '{name}'"
        raise ConfigError(
            f"--{section}.dataset_config_name={config!r} has no effect on {what} (it picks a subset of a"
            " hub dataset); drop it"
        )
    if name == "pydoc":
        _check_pydoc(section, split, field, rows, cfg.job.dry_run)
    elif cfg.job.dry_run:
        return
    elif local:
        _check_local(section, name, split, field, rows)
    elif (
        os.environ.get("RANK", "0") == "0"
    ):  # one hub request per job: rank 0 (or run_train.sh's check)
        _check_hub(section, name, split, field, config)


def _check_token_folder(cfg: JobConfig, section: str, name: str, rows: int) -> None:
    """Every file the manifest names, at its size; the run's tokenizer; a document for every row."""
    from torchtitan.data.slots import empty_slot
    from torchtitan.data.token_folder import FolderError, check_folder
    from torchtitan.data.tokenizer import load_tokenizer

    try:
        manifest = check_folder(name, load_tokenizer(cfg.model.tokenizer_path).fingerprint)
    except FolderError as e:
        raise ConfigError(f"--{section}.dataset: {e}") from None
    slot = empty_slot(manifest["source_shards"], rows)
    if slot is not None:
        raise ConfigError(
            f"--{section}.dataset={name!r}: global batch row {slot} of {rows} gets no document ({manifest['docs']}"
            f" documents in {len(manifest['source_shards'])} source shard(s)); add documents, or lower"
            " --training.local_batch_size (or --training.global_batch_size)"
        )


def _check_pydoc(section: str, split: str, field: str, rows: int, dry_run: bool) -> None:
    from torchtitan.data.corpus import PYDOC_SPLITS, pydoc_documents

    if split not in PYDOC_SPLITS:
        raise ConfigError(
            f"--{section}.dataset_split={split!r}: the embedded 'pydoc' dataset has the splits"
            f" {', '.join(PYDOC_SPLITS)}{suggest(split, PYDOC_SPLITS)}; set --{section}.dataset_split=train"
            " (or validation, the held-out docstrings)"
        )
    if field != "text":
        raise ConfigError(
            f"--{section}.dataset_text_field={field!r}: the embedded 'pydoc' dataset has only the column"
            f" text; set --{section}.dataset_text_field=text"
        )
    if dry_run:
        return
    n = len(pydoc_documents(split))
    if n < rows:
        raise ConfigError(_too_few(section, "pydoc", split, n, rows))


def _too_few(section: str, name: str, split: str, n: int, rows: int) -> str:
    return (
        f"--{section}.dataset={name!r}: split '{split}' has {n} document{'s' if n != 1 else ''}, fewer than"
        f" the {rows} rows of a global batch (every row reads its own documents); add documents, or lower"
        " --training.local_batch_size (or --training.global_batch_size)"
    )


class _QuietHF:
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


def _read_records(name: str, split: str, config: str, limit: int) -> list:
    """The first `limit` records, opened as the run opens them (data/sources.open_source)."""
    from torchtitan.data.sources import open_source

    source = open_source(name, split, config)
    try:
        return list(itertools.islice(source, limit))
    except StopIteration:  # raised by some builders for an empty file, inside a generator frame
        return []


def _listed(message: str, marker: str) -> str:
    """The Python list printed after `marker` in a datasets error message, as 'a, b'."""
    found = re.search(re.escape(marker) + r"\s*(\[[^\]]*\])", message)
    if not found:
        return ""
    try:
        return ", ".join(str(x) for x in ast.literal_eval(found.group(1)))
    except (ValueError, SyntaxError):
        return found.group(1)


def _check_local(section: str, name: str, split: str, field: str, rows: int) -> None:
    path = os.path.expanduser(name)
    is_file = os.path.isfile(path)
    if is_file and split != "train":
        raise ConfigError(
            f"--{section}.dataset_split={split!r}: the local file '{name}' has only the split 'train';"
            f" set --{section}.dataset_split=train"
        )
    from torchtitan.data.documents import first_records, is_indexed_file

    if is_indexed_file(path):  # read by its line index in the run: parse its lines the same way
        try:
            records = first_records(path, rows)
        except ValueError as e:
            raise ConfigError(_local_error(section, name, split, is_file, e, ours=True)) from None
    else:
        records = _read_hf_records(section, name, split, is_file, rows)
    if not records:
        empty = " (the file is empty)" if is_file and os.path.getsize(path) == 0 else ""
        raise ConfigError(
            f"--{section}.dataset={name!r}: no documents in split '{split}'{empty}; give a dataset with"
            " documents"
        )
    _check_text(section, name, field, records)
    if len(records) < rows:
        raise ConfigError(_too_few(section, name, split, len(records), rows))


def _read_hf_records(section: str, name: str, split: str, is_file: bool, rows: int) -> list:
    quiet = _QuietHF()
    try:
        return _read_records(name, split, "", rows)
    except StopIteration:  # json: an empty file
        return []
    except Exception as e:
        raise ConfigError(_local_error(section, name, split, is_file, e)) from None
    finally:
        quiet.restore()


def _local_error(
    section: str, name: str, split: str, is_file: bool, e: Exception, ours: bool = False
) -> str:
    from torchtitan.data.sources import LOCAL_FILE_BUILDERS

    msg = one_line(e)
    kinds = "/".join(LOCAL_FILE_BUILDERS)
    if msg.startswith("Bad split"):
        have = _listed(msg, "Available splits:")
        return (
            f"--{section}.dataset_split={split!r}: the local folder '{name}' has only the split(s) {have}"
            f" (one per file name: train.jsonl, validation.jsonl, ...){suggest(split, have.split(', '))};"
            f" set --{section}.dataset_split to one of them"
        )
    if type(e).__name__ == "EmptyDatasetError":
        return (
            f"--{section}.dataset={name!r}: the folder holds no data files (looked for {kinds}); put the"
            " data files in it or give one file"
        )
    what = "file" if is_file else "folder"
    reason = msg if ours or type(e).__name__ in msg else f"{type(e).__name__}: {msg}"
    return (
        f"--{section}.dataset={name!r}: cannot read the local {what} ({reason}); fix the data (its first"
        f" records are read as the run reads them) or give another {kinds} file or folder"
    )


def _check_text(section: str, name: str, field: str, records: list) -> None:
    """Every record holds its text where the run reads it (data/sources.document_text)."""
    from torchtitan.data.sources import DocumentError, document_text

    for i, record in enumerate(records):
        try:
            document_text(record, field, f"document {i} of '{name}'", section)
        except DocumentError as e:
            raise ConfigError(str(e)) from None


def _check_hub(section: str, name: str, split: str, field: str, config: str) -> None:
    """Opens a hub dataset as the run will (streaming) and reads its first record, in a thread
    so that a hanging network costs at most HUB_TIMEOUT_S."""
    result: dict = {}

    def read():
        try:
            result["records"] = _read_records(name, split, config, 1)
        except StopIteration:
            result["records"] = []
        except BaseException as e:  # noqa: BLE001 -- reported below, in the main thread
            result["error"] = e

    quiet = _QuietHF()
    thread = threading.Thread(target=read, name="hub-dataset-check", daemon=True)
    thread.start()
    thread.join(HUB_TIMEOUT_S)
    if thread.is_alive():
        raise ConfigError(
            f"--{section}.dataset={name!r}: no answer from the Hugging Face hub within {HUB_TIMEOUT_S:g} s;"
            f" check the network (proxy, HF_ENDPOINT), {_OTHER_SOURCE}"
        )
    quiet.restore()
    if "error" in result:
        raise ConfigError(_hub_error(section, name, split, config, result["error"]))
    if not result["records"]:
        raise ConfigError(
            f"--{section}.dataset={name!r}: the hub dataset has no documents in split '{split}'; pick"
            f" another --{section}.dataset_split, {_OTHER_SOURCE}"
        )
    _check_text(section, name, field, result["records"])


def _offline_vars() -> list[str]:
    return [
        v
        for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
        if os.environ.get(v, "").strip().upper() in ("1", "ON", "YES", "TRUE")
    ]


def _hub_error(section: str, name: str, split: str, config: str, e: BaseException) -> str:
    msg, kind = one_line(e), type(e).__name__
    key = f"--{section}.dataset={name!r}"
    if (
        isinstance(e, ConnectionError)
        or "OfflineModeIsEnabled" in msg
        or kind == "OfflineModeIsEnabled"
    ):
        offline = _offline_vars()
        if offline:
            return (
                f"{key}: cannot reach the Hugging Face hub: offline mode is on ({', '.join(offline)});"
                f" unset {' and '.join(offline)} to stream it, {_OTHER_SOURCE}"
            )
        return (
            f"{key}: cannot reach the Hugging Face hub ({msg}); check the network (proxy, HF_ENDPOINT),"
            f" {_OTHER_SOURCE}"
        )
    if kind == "DatasetNotFoundError":
        return (
            f"{key}: {msg.rstrip('.')}; check the name (owner/name as on huggingface.co/datasets), and set"
            f" HF_TOKEN for a gated or private dataset (after accepting its terms), {_OTHER_SOURCE}"
        )
    if msg.startswith("Config name is missing"):
        return (
            f"--{section}.dataset_config_name={config!r}: the hub dataset '{name}' has several configs"
            f" ({_listed(msg, 'available configs:')}); set --{section}.dataset_config_name to one of them"
        )
    if msg.startswith("BuilderConfig"):
        have = _listed(msg, "Available:")
        return (
            f"--{section}.dataset_config_name={config!r}: the hub dataset '{name}' has no such config"
            f"{suggest(config, have.split(', '))} (it has: {have}); set --{section}.dataset_config_name to one of them"
        )
    if msg.startswith("Bad split"):
        have = _listed(msg, "Available splits:")
        return (
            f"--{section}.dataset_split={split!r}: the hub dataset '{name}' has no such split"
            f"{suggest(split, have.split(', '))} (it has: {have}); set --{section}.dataset_split to one of them"
        )
    reason = msg if kind in msg else f"{kind}: {msg}"
    return (
        f"{key}: cannot stream it from the Hugging Face hub ({reason}); check the name, the"
        f" --{section}.dataset_config_name and dataset_split, the network and HF_TOKEN, {_OTHER_SOURCE}"
    )
