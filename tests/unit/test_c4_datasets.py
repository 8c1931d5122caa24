"""Upstream's dataset names (data/named.py): c4_test is the bundled file, found from the
current directory or the repository root, or at [section] dataset_path; c4 and c4_validation
are allenai/c4 on the hub, and offline they fail before launch in one line offering c4_test."""

import json
import os
import sys
from dataclasses import dataclass, fields

import pytest
from check_data_helpers import DEBUG, ROOT, check_error, write_jsonl
from config_helpers import cfg_of

from torchtitan.checks.data import check_data_inputs
from torchtitan.config import ConfigError
from torchtitan.data import hub_check, named
from torchtitan.data.dataset_checks import DatasetCheck
from torchtitan.data.kinds import check_named, kind_of, open_documents
from torchtitan.data.sources import DatasetKeys

DATA = os.path.join(ROOT, "tests", "assets", "c4_test", "data.json")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import make_c4_test  # noqa: E402


@dataclass(frozen=True)
class PathKeys(DatasetKeys):
    """DatasetKeys with [section] dataset_path, as the run will hand it over."""

    dataset_path: str = ""


def _lines() -> list[dict]:
    with open(DATA, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


# --------------------------------------------------------------------------- the file


def test_c4_test_file_holds_1997_text_documents_under_3_mb():
    records = _lines()
    assert len(records) == 1997
    assert all(list(r) == ["text"] and r["text"].strip() for r in records)
    assert os.path.getsize(DATA) == 503519 < 3 * 2**20
    assert records[0]["text"].startswith('The "assert" statement\n')


@pytest.mark.skipif(
    f"{sys.version_info.major}.{sys.version_info.minor}" != make_c4_test.GENERATED_WITH,
    reason="the topics of another Python version",
)
def test_script_writes_the_committed_file_bitwise(tmp_path):
    out = tmp_path / "data.json"
    assert make_c4_test.main(["--out", str(out)]) == 0
    assert out.read_bytes() == open(DATA, "rb").read()


# --------------------------------------------------------------------------- resolving names


def test_c4_test_found_from_the_repository_root_elsewhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    got = named.resolve(DatasetKeys("c4_test", "validation", "", "text", "validation"))
    assert got == DatasetKeys(DATA, "train", "", "text", "validation")
    assert kind_of("c4_test").name == "named" and kind_of(got.dataset).name == "lines"


def test_c4_test_of_the_current_directory_first(tmp_path, monkeypatch):
    local = tmp_path / "tests" / "assets" / "c4_test"
    local.mkdir(parents=True)
    write_jsonl(local / "data.json", [{"text": "mine"}])
    monkeypatch.chdir(tmp_path)
    got = named.resolve(DatasetKeys("c4_test", "train"))
    assert got.dataset == str(local / "data.json")


def test_c4_test_nowhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(named, "REPO_ROOT", str(tmp_path / "none"))
    with pytest.raises(ConfigError) as e:
        named.resolve(DatasetKeys("c4_test", "train"))
    assert str(e.value) == (
        f"--training.dataset='c4_test': {os.path.join('tests', 'assets', 'c4_test', 'data.json')} is"
        f" found neither in the current directory nor in the repository root ({tmp_path / 'none'});"
        " run from the repository, or give --training.dataset_path (the file or folder of its documents)"
    )


@pytest.mark.parametrize("name, split", [("c4", "train"), ("c4_validation", "validation")])
def test_c4_names_are_allenai_c4_en_with_their_split(name, split):
    got = named.resolve(DatasetKeys(name, "other", "", "text", "validation"))
    assert got == DatasetKeys("allenai/c4", split, "en", "text", "validation")
    # a config of the user's own wins; the name keeps its split
    got = named.resolve(DatasetKeys(name, "train", "realnewslike"))
    assert (got.config_name, got.split) == ("realnewslike", split)


def test_dataset_path_replaces_the_location(tmp_path):
    path = write_jsonl(tmp_path / "c4.jsonl", [{"text": "a"}])
    assert named.resolve(DatasetKeys("c4_test", "train"), path).dataset == path
    # a local copy of allenai/c4 is read as its files (no hub config); a hub mirror keeps "en"
    local = named.resolve(DatasetKeys("c4", "validation"), str(tmp_path))
    assert (local.dataset, local.split, local.config_name) == (str(tmp_path), "train", "")
    assert named.resolve(DatasetKeys("c4", "train"), "me/c4-mirror").config_name == "en"


def test_dataset_path_that_does_not_exist(tmp_path):
    missing = str(tmp_path / "no.json")
    with pytest.raises(ConfigError) as e:
        named.resolve(DatasetKeys("c4_test", "train", section="validation"), missing)
    assert str(e.value) == (
        f"--validation.dataset_path={missing!r}: no such file or folder (the location of the named"
        " dataset 'c4_test'); give an existing path, or leave it empty for the bundled 2K-document sample"
    )


def test_check_named_reads_dataset_path_from_the_keys(tmp_path):
    path = write_jsonl(tmp_path / "few.jsonl", [{"text": "a"}, {"text": "b"}])
    check_named(DatasetCheck(PathKeys("c4_test", "train", dataset_path=path), rows=2))
    with pytest.raises(ConfigError) as e:
        check_named(DatasetCheck(PathKeys("c4_test", "train", dataset_path=path), rows=3))
    assert str(e.value).startswith(
        f"--training.dataset='c4_test' ({path}): split 'train' has 2 documents, fewer than the 3 rows"
    )


@pytest.mark.skipif(
    "dataset_path" not in {f.name for f in fields(DatasetKeys)},
    reason="the run hands over dataset_path once sources.DatasetKeys declares it",
)
def test_training_dataset_path_reaches_the_check(tmp_path):
    path = write_jsonl(tmp_path / "one.jsonl", [{"text": "a"}])
    cfg = cfg_of(["--training.dataset=c4_test", "--training.local_batch_size=2"])
    cfg.training.dataset_path = path
    with pytest.raises(ConfigError, match=r"split 'train' has 1 document, fewer than the 2 rows"):
        check_data_inputs(cfg, DEBUG)


# --------------------------------------------------------------------------- the checks and the run


def test_c4_test_passes_the_check_for_training_and_validation(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # found from the repository root
    argv = ["--training.dataset=c4_test", "--validation.enable", "--validation.dataset=c4_test"]
    check_data_inputs(cfg_of(argv), DEBUG)
    assert check_error(["--training.dataset=c4_test", "--training.local_batch_size=1998"]) == (
        f"--training.dataset='c4_test' ({DATA}): split 'train' has 1997 documents, fewer than the"
        " 1998 rows of a global batch (every row reads its own documents); add documents, or lower"
        " --training.local_batch_size (or --training.global_batch_size)"
    )


def test_the_run_reads_the_file_as_lines():
    from torchtitan.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer("")
    docs = open_documents("c4_test", "validation", "", "text", tokenizer, section="validation")
    assert (docs.path, docs.size) == (DATA, 1997)
    first = tokenizer.encode(_lines()[0]["text"])
    assert list(docs.tokens(0, 0))[: len(first)][1:] == list(first)[1:]


def test_c4_offline_names_c4_test(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)

    def offline(keys, limit):
        assert (keys.dataset, keys.config_name, keys.split) == ("allenai/c4", "en", "validation")
        raise ConnectionError("Couldn't reach 'allenai/c4' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(hub_check, "read_records", offline)
    assert check_error(["--validation.enable", "--validation.dataset=c4_validation"]) == (
        "--validation.dataset='c4_validation' (allenai/c4): cannot reach the Hugging Face hub: offline"
        " mode is on (HF_HUB_OFFLINE); unset HF_HUB_OFFLINE to stream it, or use"
        " --validation.dataset=c4_test (the bundled 2K-document sample, no network)"
    )
