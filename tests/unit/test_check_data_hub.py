"""check_data_inputs for hub datasets (reached within a bounded time, each failure one line
naming the key and the fix), and the DataError a bad document met later in the run raises."""

import json
import time

import pytest
from check_data_helpers import DEBUG, check_error, docs, write_jsonl
from config_helpers import cfg_of

from torchtitan.checks.data import check_data_inputs
from torchtitan.data import hub_check

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")


# --------------------------------------------------------------------------- hub datasets


def _hub_raises(monkeypatch, error):
    def read(keys, limit):
        assert limit == 1  # the hub gives one record
        raise error

    monkeypatch.setattr(hub_check, "read_records", read)


def test_hub_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    _hub_raises(
        monkeypatch,
        ConnectionError("Couldn't reach 'allenai/c4' on the Hub (OfflineModeIsEnabled)"),
    )
    assert check_error(["--training.dataset=allenai/c4", "--training.dataset_config_name=en"]) == (
        "--training.dataset='allenai/c4': cannot reach the Hugging Face hub: offline mode is on (HF_HUB_OFFLINE);"
        " unset HF_HUB_OFFLINE to stream it, or use a local file or 'pydoc'"
    )


def test_hub_without_network(monkeypatch):
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    _hub_raises(
        monkeypatch,
        ConnectionError("Couldn't reach 'allenai/c4' on the Hub (LocalEntryNotFoundError)"),
    )
    assert check_error(["--training.dataset=allenai/c4"]) == (
        "--training.dataset='allenai/c4': cannot reach the Hugging Face hub (Couldn't reach 'allenai/c4' on the Hub"
        " (LocalEntryNotFoundError)); check the network (proxy, HF_ENDPOINT), or use a local file or 'pydoc'"
    )


def test_hub_dataset_not_found_or_gated(monkeypatch):
    from datasets.exceptions import DatasetNotFoundError

    _hub_raises(
        monkeypatch,
        DatasetNotFoundError("Dataset 'me/nope' doesn't exist on the Hub or cannot be accessed."),
    )
    assert check_error(["--training.dataset=me/nope"]) == (
        "--training.dataset='me/nope': Dataset 'me/nope' doesn't exist on the Hub or cannot be accessed; check the"
        " name (owner/name as on huggingface.co/datasets), and set HF_TOKEN for a gated or private dataset (after"
        " accepting its terms), or use a local file or 'pydoc'"
    )


def test_hub_config_and_split(monkeypatch):
    _hub_raises(
        monkeypatch,
        ValueError(
            "Config name is missing.\nPlease pick one among the available configs: ['en', 'realnewslike']"
            "\nExample of usage:\n\t`load_dataset('allenai/c4', 'en')`"
        ),
    )
    assert check_error(["--validation.enable=true", "--validation.dataset=allenai/c4"]) == (
        "--validation.dataset_config_name='': the hub dataset 'allenai/c4' has several configs (en, realnewslike);"
        " set --validation.dataset_config_name to one of them"
    )
    _hub_raises(
        monkeypatch, ValueError("BuilderConfig 'eng' not found. Available: ['en', 'realnewslike']")
    )
    assert check_error(["--training.dataset=allenai/c4", "--training.dataset_config_name=eng"]) == (
        "--training.dataset_config_name='eng': the hub dataset 'allenai/c4' has no such config (did you mean 'en'?)"
        " (it has: en, realnewslike); set --training.dataset_config_name to one of them"
    )
    _hub_raises(
        monkeypatch, ValueError("Bad split: valid. Available splits: ['train', 'validation']")
    )
    assert check_error(["--training.dataset=allenai/c4", "--training.dataset_split=valid"]) == (
        "--training.dataset_split='valid': the hub dataset 'allenai/c4' has no such split (did you mean"
        " 'validation'?) (it has: train, validation); set --training.dataset_split to one of them"
    )


def test_hub_other_failure(monkeypatch):
    from datasets.exceptions import DatasetGenerationError

    _hub_raises(monkeypatch, DatasetGenerationError("something\nbroke   badly"))
    assert check_error(["--training.dataset=me/data"]) == (
        "--training.dataset='me/data': cannot stream it from the Hugging Face hub (DatasetGenerationError: something broke"
        " badly); check the name, the --training.dataset_config_name and dataset_split, the network and HF_TOKEN,"
        " or use a local file or 'pydoc'"
    )


def test_hub_that_does_not_answer_in_time(monkeypatch):
    monkeypatch.setattr(hub_check, "HUB_TIMEOUT_S", 0.2)
    monkeypatch.setattr(hub_check, "read_records", lambda *a: time.sleep(5))
    start = time.perf_counter()
    assert check_error(["--training.dataset=me/data"]) == (
        "--training.dataset='me/data': no answer from the Hugging Face hub within 0.2 s; check the network (proxy,"
        " HF_ENDPOINT), or use a local file or 'pydoc'"
    )
    assert time.perf_counter() - start < 2


def test_hub_first_record(monkeypatch):
    monkeypatch.setattr(hub_check, "read_records", lambda *a: [{"content": "x", "url": "u"}])
    assert check_error(["--training.dataset=me/data"]) == (
        "--training.dataset_text_field='text': document 0 of 'me/data' has no such column; its columns are: content, url; set"
        " --training.dataset_text_field to the one holding the document text"
    )
    check_data_inputs(
        cfg_of(["--training.dataset=me/data", "--training.dataset_text_field=content"]), DEBUG
    )
    monkeypatch.setattr(hub_check, "read_records", lambda *a: [])
    assert check_error(["--training.dataset=me/data", "--training.dataset_split=test"]) == (
        "--training.dataset='me/data': the hub dataset has no documents in split 'test'; pick another"
        " --training.dataset_split, or use a local file or 'pydoc'"
    )


# --------------------------------------------------------------------------- at run time: DataError


def _first_batches(path, n, lbs=2, **kw):
    from torchtitan.data.dataloader import build_dataloader
    from torchtitan.data.tokenizer import Tokenizer

    cfg = cfg_of(
        [f"--training.dataset={path}", f"--training.local_batch_size={lbs}", "--training.seq_len=8"]
    )
    loader = iter(
        build_dataloader(cfg.training, Tokenizer(), dp_rank=0, dp_degree=1, accum_steps=1)
    )
    return [next(loader) for _ in range(n)]


@pytest.mark.parametrize(
    "bad, what",
    [
        ({"text": None, "id": 6}, "has no text (null or missing)"),
        ({"text": 7, "id": 6}, "holds int 7, not a string"),
    ],
)
def test_a_later_bad_document_is_a_data_error(tmp_path, bad, what):
    from torchtitan.data.datasets import DataError

    path = write_jsonl(tmp_path / "d.jsonl", [*docs(6), bad, *docs(3)])
    check_data_inputs(
        cfg_of([f"--training.dataset={path}"]), DEBUG, global_batch=2
    )  # reads documents 0-1
    with pytest.raises(DataError) as info:
        _first_batches(path, 100)
    assert str(info.value) == (
        f"--training.dataset_text_field='text': document 6 of dataset '{path}' (split 'train') {what}; set"
        " --training.dataset_text_field to the column holding the text, or fix that record"
    )


def test_a_missing_column_at_run_time_is_a_data_error(tmp_path):
    from torchtitan.data.datasets import DataError

    path = write_jsonl(tmp_path / "d.jsonl", docs(4, field="body"))
    with pytest.raises(DataError) as info:
        _first_batches(path, 1)
    assert str(info.value) == (
        f"--training.dataset_text_field='text': document 0 of dataset '{path}' (split 'train') has no such column;"
        " its columns are: body, id; set --training.dataset_text_field to the one holding the document text"
    )
    assert isinstance(info.value, RuntimeError)


def test_an_unreadable_record_at_run_time_is_a_data_error(tmp_path, capfd):
    from torchtitan.data.datasets import DataError

    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in docs(4)) + '{"text": \n')
    with pytest.raises(DataError) as info:
        _first_batches(path, 100)
    assert str(info.value).startswith(
        f"--training.dataset: document 4 of dataset '{path}' (split 'train') is not JSON ("
    )
    assert "Failed to load JSON" not in capfd.readouterr().err
