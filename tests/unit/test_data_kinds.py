"""The one table of dataset kinds (data/kinds.py): every kind has its detect, open and check,
real datasets are told apart by it, each kind's check reads the data as its opener does, and a
kind added to the table is used by the run's loader, the config check and the path check."""

import json

import pytest
from check_data_helpers import DEBUG, check_error, docs
from config_helpers import cfg_of

from torchtitan.checks import load_config
from torchtitan.checks.data import check_data_inputs, check_dataset_path
from torchtitan.config import ConfigError, build_config
from torchtitan.data import kinds
from torchtitan.data.dataloader import build_dataloader
from torchtitan.data.kinds import KINDS, DatasetKind, dataset_kind, kind_of, open_documents
from torchtitan.data.tokenizer import Tokenizer

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")


def test_every_kind_has_detect_open_and_check():
    names = [k.name for k in KINDS]
    assert len(set(names)) == len(names), names
    for kind in KINDS:
        assert callable(kind.detect) and callable(kind.open) and callable(kind.check), kind.name
        assert kind.path_check is None or callable(kind.path_check), kind.name
        assert dataset_kind(kind.name) is kind
    assert KINDS[-1] is dataset_kind("hub") and kind_of("owner/any-name") is KINDS[-1]


def test_datasets_are_told_apart(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"text": "a"}\n')
    (tmp_path / "array.json").write_text('[{"text": "a"}]')  # JSON, not JSON Lines: streamed
    (tmp_path / "d.txt").write_text("a\n")
    (tmp_path / "d.parquet").write_bytes(b"PAR1")
    (tmp_path / "d.arrow").write_bytes(b"")
    (tmp_path / "d.xml").write_text("<doc/>")
    for folder, marker in (("tokens", "manifest.json"), ("saved", "state.json"), ("data", "")):
        (tmp_path / folder).mkdir()
        if marker:
            (tmp_path / folder / marker).write_text("{}")
    expected = {
        "d.jsonl": "lines",
        "d.txt": "lines",
        "array.json": "file",
        "d.parquet": "file",
        "d.xml": "file",  # its path check refuses it
        "d.arrow": "arrow",
        "tokens": "tokens",
        "saved": "saved",
        "data": "folder",
    }
    for name, kind in expected.items():
        assert kind_of(str(tmp_path / name)).name == kind, name
    assert kind_of("pydoc").name == "pydoc"
    assert kind_of("allenai/c4").name == "hub"
    assert kind_of(str(tmp_path / "missing.jsonl")).name == "hub"  # its path check refuses it


def _saved(tmp_path, column="text"):
    import datasets

    folder = str(tmp_path / f"saved_{column}")
    datasets.Dataset.from_dict({column: [f"doc {i} " * 4 for i in range(8)]}).save_to_disk(folder)
    return folder


def test_a_saved_dataset_is_checked_as_the_run_reads_it(tmp_path):
    """A save_to_disk folder is read by load_from_disk in the run, and so in its check (the
    check once streamed it, which datasets refuses for such a folder)."""
    folder = _saved(tmp_path)
    check_data_inputs(cfg_of([f"--training.dataset={folder}"]), DEBUG)
    src = open_documents(folder, "train", "", "text", Tokenizer())
    assert src.kind == "indexed" and src.size == 8
    body = _saved(tmp_path, "body")
    assert check_error([f"--training.dataset={body}"]) == (
        f"--training.dataset_text_field='text': document 0 of '{body}' has no such column; its columns"
        " are: body; set --training.dataset_text_field to the one holding the document text"
    )


def test_an_unknown_file_type_is_refused_by_its_kind_even_without_the_path_check(tmp_path):
    path = tmp_path / "train.xml"
    path.write_text("<doc/>")
    expected = (
        f"--training.dataset: cannot read '{path}': use a .json/.jsonl/.parquet/.txt/.csv/.arrow"
        " file or a folder"
    )
    with pytest.raises(ConfigError) as info:
        check_dataset_path(str(path))
    assert str(info.value) == expected
    assert check_error([f"--training.dataset={path}"]) == expected


TEXTS = ["alpha beta gamma", "delta epsilon", "zeta eta theta", "iota kappa lambda"]


@pytest.fixture
def memo_kind(monkeypatch):
    """A kind that is not in the table, added in front of it: 'memo:<anything>' names four
    documents held in memory. Records every call."""
    from torchtitan.data.documents import IndexedText

    calls = []

    def open_memo(keys, tokenizer):
        calls.append(("open", keys.dataset, keys.split, keys.section))
        name = f"memo '{keys.dataset}'"
        return IndexedText(name, tokenizer, "text", keys.section, texts=TEXTS)

    def check_memo(c):
        calls.append(("check", c.keys.dataset, c.rows, c.dry_run))
        if c.keys.text_field != "text":
            raise ConfigError(f"--{c.keys.section}.dataset_text_field: a memo has only text")

    def path_memo(dataset, section):
        calls.append(("path", dataset, section))

    memo = DatasetKind("memo", lambda d: d.startswith("memo:"), open_memo, check_memo, path_memo)
    monkeypatch.setattr(kinds, "KINDS", [memo, *KINDS])
    return memo, calls


def test_a_kind_added_to_the_table_is_used_by_the_checks_and_the_loader(memo_kind):
    memo, calls = memo_kind
    assert kind_of("memo:notes") is memo and kind_of("pydoc").name == "pydoc"

    # the config check: the path check, then the dataset check, for training and validation
    argv = ["--training.dataset=memo:notes", "--training.local_batch_size=2"]
    load_config([*argv, "--validation.enable=true", "--validation.dataset=memo:held"], 1)
    assert calls == [
        ("path", "memo:notes", "training"),
        ("path", "memo:held", "validation"),
        ("check", "memo:notes", 2, False),
        ("check", "memo:held", 2, False),
    ]
    assert check_error([*argv, "--training.dataset_text_field=body"]) == (
        "--training.dataset_text_field: a memo has only text"
    )

    # the run's loader: row i reads documents i, i + 2, ... of the memo
    calls.clear()
    cfg = build_config([*argv, "--training.seq_len=4"])[0].training
    tok = Tokenizer()
    inputs, labels = next(iter(build_dataloader(cfg, tok, dp_rank=0, dp_degree=1, accum_steps=1)))
    assert calls == [("open", "memo:notes", "train", "training")]
    for row in range(2):
        stream = tok.encode(TEXTS[row]) + tok.encode(TEXTS[row + 2])
        assert inputs[row].tolist() == stream[:4] and labels[row].tolist() == stream[1:5]


def test_a_kind_added_to_the_table_is_used_for_a_mixture_source(memo_kind, tmp_path):
    _, calls = memo_kind
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in docs(8)))
    cfg = cfg_of(["--training.local_batch_size=2"])
    cfg.training.dataset_mix = [f"{path}:0.5", "memo:notes:0.5"]
    check_data_inputs(cfg, DEBUG)
    assert calls == [("check", "memo:notes", 2, False)]
