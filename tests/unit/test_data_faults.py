"""Honest errors: a fault of the input is one line (ConfigError and exit 2 before the run, a
DataError during it), a bug of ours keeps its traceback (data/input_errors.py)."""

import gzip
import json
import zlib

import pytest
from check_data_helpers import DEBUG, check_error, docs, write_jsonl
from config_helpers import cfg_of

from torchtitan.checks import load_config_or_exit
from torchtitan.checks.data import check_data_inputs
from torchtitan.data import dataset_checks, hub_check
from torchtitan.data.input_errors import input_fault

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")


def _raised(error, module: str = __name__):
    """`error` as raised by a function of `module` (its traceback says where)."""
    where = {"__name__": module}
    exec("def load(error):\n    raise error\n", where)
    try:
        where["load"](error)
    except BaseException as e:  # noqa: BLE001 -- the test inspects whatever it is
        return e


def test_what_is_a_fault_of_the_input():
    import pyarrow as pa
    from datasets.exceptions import DatasetGenerationError, DatasetNotFoundError

    faults = [
        FileNotFoundError(2, "No such file or directory"),
        PermissionError(13, "Permission denied"),
        ConnectionError("Couldn't reach the Hub"),
        ValueError("Bad split: valid"),
        json.JSONDecodeError("Expecting value", "x", 0),
        UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"),
        EOFError("Compressed file ended before the end-of-stream marker was reached"),
        zlib.error("Error -3 while decompressing data"),
        DatasetGenerationError("An error occurred while generating the dataset"),
        DatasetNotFoundError("Dataset 'me/nope' doesn't exist on the Hub"),
        pa.lib.ArrowInvalid("Parquet magic bytes not found in footer."),
        pa.lib.ArrowTypeError("Expected bytes, got a 'int' object"),  # a TypeError of pyarrow's
        _raised(RuntimeError("Dataset scripts are no longer supported"), "datasets.load"),
    ]
    bugs = [
        TypeError("unsupported operand type(s)"),
        AttributeError("'NoneType' object has no attribute 'shard'"),
        KeyError("text"),
        ZeroDivisionError("division by zero"),
        NameError("name 'x' is not defined"),
        _raised(RuntimeError("dictionary changed size during iteration")),  # raised by our code
        _raised(TypeError("got an unexpected keyword argument"), "datasets.load"),  # called wrong
    ]
    for e in faults:
        assert input_fault(e), repr(e)
    for e in bugs:
        assert not input_fault(e), repr(e)


# --------------------------------------------------------------------------- a bug: its traceback


def _planted_bug(*args, **kwargs):
    raise ZeroDivisionError("a bug planted by the test")


def test_a_bug_under_the_check_of_a_streamed_file_keeps_its_traceback(tmp_path, monkeypatch):
    import datasets

    path = tmp_path / "d.csv"
    path.write_text("text\n" + "".join(f"doc {i}\n" for i in range(8)))
    check_data_inputs(cfg_of([f"--training.dataset={path}"]), DEBUG)
    monkeypatch.setattr(datasets, "load_dataset", _planted_bug)
    with pytest.raises(ZeroDivisionError) as info:
        check_data_inputs(cfg_of([f"--training.dataset={path}"]), DEBUG)
    assert info.traceback[-1].name == "_planted_bug"
    # the entry point exits with the traceback, not with exit 2 and one line
    with pytest.raises(ZeroDivisionError):
        load_config_or_exit([f"--training.dataset={path}"], 1, quiet=True)


def test_a_bug_under_the_check_of_a_saved_table_keeps_its_traceback(tmp_path, monkeypatch):
    import datasets

    path = tmp_path / "d.arrow"
    path.write_bytes(b"")
    monkeypatch.setattr(datasets.Dataset, "from_file", _planted_bug)
    with pytest.raises(ZeroDivisionError):
        check_data_inputs(cfg_of([f"--training.dataset={path}"]), DEBUG)


def test_a_bug_under_the_check_of_a_line_file_keeps_its_traceback(tmp_path, monkeypatch):
    path = write_jsonl(tmp_path / "d.jsonl", docs(8))
    monkeypatch.setattr(dataset_checks, "first_records", _planted_bug)
    with pytest.raises(ZeroDivisionError):
        check_data_inputs(cfg_of([f"--training.dataset={path}"]), DEBUG)


def test_a_bug_under_the_hub_check_keeps_the_threads_traceback(monkeypatch):
    def read_records(keys, limit):
        return keys.no_such_attribute  # a bug: AttributeError, raised in the check's thread

    monkeypatch.setattr(hub_check, "read_records", read_records)
    with pytest.raises(AttributeError) as info:
        check_data_inputs(cfg_of(["--training.dataset=me/data"]), DEBUG)
    assert info.traceback[-1].name == "read_records"


def test_a_bug_under_the_tokenizer_load_keeps_its_traceback(tmp_path, monkeypatch):
    from torchtitan.data import tokenizer
    from torchtitan.data.tokenizer import BUNDLED_TOKENIZER, Tokenizer

    monkeypatch.setattr(tokenizer.HFTokenizer, "from_file", _planted_bug)
    with pytest.raises(ZeroDivisionError):
        Tokenizer(BUNDLED_TOKENIZER)


class _Source:
    """An HF stream stand-in of one shard whose second record raises `error`."""

    num_shards = 1

    def __init__(self, error):
        self.error = error

    def __iter__(self):
        yield {"text": "the first document"}
        raise self.error


def _streamed(make_source):
    from torchtitan.data.documents import StreamedText
    from torchtitan.data.tokenizer import Tokenizer

    return StreamedText(
        "dataset 'me/data' (split 'train')", Tokenizer(), "text", "training", make_source
    )


def test_at_run_time_a_bad_record_is_one_line_and_a_bug_its_traceback():
    from torchtitan.data.documents import DataError

    docs_ = _streamed(lambda: _Source(ValueError("JSON parse error: Invalid value. in row 1")))
    assert docs_.tokens(0, 0) is not None
    with pytest.raises(DataError) as info:
        docs_.tokens(0, 1)
    assert str(info.value) == (
        "--training.dataset: cannot read dataset 'me/data' (split 'train') (JSON parse error: Invalid"
        " value. in row 1); fix or remove that record, or use another dataset"
    )
    docs_ = _streamed(lambda: _Source(AttributeError("'NoneType' object has no attribute 'get'")))
    docs_.tokens(0, 0)
    with pytest.raises(AttributeError):
        docs_.tokens(0, 1)


def test_at_run_time_a_bug_while_opening_a_stream_keeps_its_traceback():
    from torchtitan.data.documents import DataError

    def gone():
        raise FileNotFoundError(2, "No such file or directory")

    with pytest.raises(DataError) as info:
        _streamed(gone)
    assert str(info.value) == (
        "--training.dataset: cannot open dataset 'me/data' (split 'train') ([Errno 2] No such file or"
        " directory); check that it is still there and readable"
    )
    with pytest.raises(ZeroDivisionError):
        _streamed(_planted_bug)


# --------------------------------------------------------------------------- bad inputs: one line


def test_a_folder_with_a_loading_script_is_one_line(tmp_path):
    """datasets raises a RuntimeError for it: the input's fault, not ours."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "corpus.py").write_text("import datasets\n")
    assert check_error([f"--training.dataset={folder}"]).startswith(
        f"--training.dataset='{folder}': cannot read the local folder (RuntimeError: Dataset scripts"
        " are no longer supported"
    )


def test_a_truncated_compressed_file_is_one_line(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    data = "".join(json.dumps(d) + "\n" for d in docs(8)).encode()
    (folder / "train.jsonl.gz").write_bytes(gzip.compress(data)[:30])
    assert check_error([f"--training.dataset={folder}"]).startswith(
        f"--training.dataset='{folder}': cannot read the local folder (EOFError: Compressed file ended"
    )
