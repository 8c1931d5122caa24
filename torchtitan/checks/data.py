"""Tokenizer and dataset checks that read the inputs (torch-free), run before any process group.

The tokenizer is loaded as the run loads it (once per process: data/tokenizer.load_tokenizer).
Each dataset is checked by its kind's entry of data/kinds.py, which opens it the way the run
opens it and reads only its first records (data/dataset_checks.py, data/hub_check.py). Every
fault of the input is one ConfigError line that starts with the key, names the value and says
how to fix it; a bug of ours keeps its traceback.
"""

import os
import re

from torchtitan.config.job_config import JobConfig
from torchtitan.config.manager import ConfigError
from torchtitan.data.dataset_checks import DatasetCheck
from torchtitan.data.kinds import kind_of
from torchtitan.data.sources import DatasetKeys, per_source_split

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

    if t.dataloader.num_workers != "auto" and (
        not isinstance(t.dataloader.num_workers, int) or t.dataloader.num_workers < 0
    ):
        raise ConfigError(
            f"--training.dataloader.num_workers={t.dataloader.num_workers}: must be >= 0 (0: read on the"
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
    seen = {}
    for name in training_datasets(t) if t.dataset_mix else []:
        delimiters = kind_of(name).delimiters
        found = delimiters(name) if delimiters is not None else None
        if found is not None:  # None: the run's tokenizer delimits, or check_dataset said why
            seen[name] = found
    if len(set(seen.values())) > 1:
        parts = ", ".join(f"'{n}' BOS {b} EOS {e}" for n, (b, e, _) in seen.items())
        raise ConfigError(
            f"--training.dataset_mix: its pre-tokenized sources delimit documents differently ({parts});"
            " tokenize every source with the run's tokenizer"
        )


def check_dataset_path(dataset: str, section: str = "training") -> None:
    """A [section] dataset that names a local path must exist and be a readable kind (before
    anything is opened): its kind's path check (data/kinds.py)."""
    path_check = kind_of(dataset).path_check
    if path_check is not None:
        path_check(dataset, section)


# --------------------------------------------------------------------------- tokenizer


def check_tokenizer(cfg: JobConfig, args) -> None:
    """Loads the tokenizer as the run will (model.tokenizer_path, else upstream's
    <model.hf_assets_path>/tokenizer.json: data/tokenizer.tokenizer_file); its size must fit a
    flavor's fixed vocab_size. A dry run of such a flavor reads no tokenizer, so neither does
    its check."""
    if cfg.job.dry_run and args.vocab_size:
        return
    from torchtitan.data.tokenizer import TokenizerError, load_tokenizer, tokenizer_file

    m = cfg.model
    path = tokenizer_file(m)
    if m.tokenizer_path:
        name, value = "tokenizer_path", m.tokenizer_path
        fix = "give an HF tokenizer.json file (or its folder), or leave it empty for the bundled tokenizer"
    else:
        name, value = "hf_assets_path", m.hf_assets_path
        fix = (
            "give the folder that holds the model's tokenizer.json, or set --model.tokenizer_path,"
            " or leave both empty for the bundled tokenizer"
        )
    if path:
        full = os.path.expanduser(path)
        if os.path.isdir(full):
            full = os.path.join(full, "tokenizer.json")
        if not os.path.isfile(full):
            raise ConfigError(f"--model.{name}: '{full}' not found; {fix}")
    key = f"--model.{name}={value!r}"
    try:
        tokenizer = load_tokenizer(path)
    except TokenizerError as e:
        where = "" if e.path == os.path.expanduser(path) else f" ('{e.path}')"
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
    dataset key), by the check of its kind. A dry run reads no data: each kind checks only what
    needs no reading (the 'pydoc' split, a config name that has no effect)."""
    src = getattr(cfg, section)
    name = name or src.dataset
    split = per_source_split(name, src.dataset_split) if per_source else src.dataset_split
    mixed = per_source or (section == "training" and bool(src.dataset_mix))
    path = "" if mixed else src.dataset_path
    keys = DatasetKeys(name, split, src.dataset_config_name, src.dataset_text_field, section, path)
    from torchtitan.data.tokenizer import tokenizer_file

    job = DatasetCheck(keys, rows, cfg.job.dry_run, tokenizer_file(cfg.model))
    kind_of(name).check(job)
