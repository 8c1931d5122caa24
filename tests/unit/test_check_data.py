"""check_data_inputs, local inputs: the tokenizer, the embedded dataset and local datasets,
read before any process group; each problem one ConfigError line that starts with the key.
(Hub datasets and run-time DataError: test_check_data_hub.py.)"""

import dataclasses
import time

import pytest
from check_data_helpers import DEBUG, FIXED, check_error, docs, write_jsonl
from config_helpers import cfg_of, config_error

from torchtitan.checks.data import check_data_inputs
from torchtitan.data import hub_check
from torchtitan.models.flavors import flavors_of

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")

# the llama3 flavors that take the tokenizer's vocabulary (vocab_size 0)
OPEN_VOCABULARY_FLAVORS = ", ".join(
    name for name, args in flavors_of("llama3").items() if args.vocab_size == 0
)


def word_tokenizer(path, words) -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[-1]))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path))
    return str(path)


# --------------------------------------------------------------------------- tokenizer

TOKENIZER_FIX = "give the tokenizer.json of a Hugging Face tokenizer (or its folder), or leave it empty for the bundled tokenizer"


@pytest.mark.parametrize(
    "content, reason",
    [
        ('{"a": 1}', "JSON, but no tokenizer 'model' in it (its keys: a)"),
        ("vocab: 32000\n", "not JSON (Expecting value: line 1 column 1 (char 0))"),
        ("", "the file is empty"),
        ("  \n", "the file is empty"),
        ("[1, 2]", "a JSON list, not a tokenizer object"),
        (
            '{"version": "1.0", "model": {"type": "Nope"}}',
            "the tokenizers library cannot load it (data did not match",
        ),
    ],
)
def test_file_that_is_not_a_tokenizer(tmp_path, content, reason):
    path = tmp_path / "tokenizer.json"
    path.write_text(content)
    msg = check_error([f"--model.tokenizer_path={path}"])
    assert msg.startswith(f"--model.tokenizer_path='{path}': not an HF tokenizer.json: {reason}")
    assert msg.endswith(TOKENIZER_FIX)


def test_binary_tokenizer_file(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_bytes(b"\x89PNG\x00\xff\xfe")
    assert check_error([f"--model.tokenizer_path={path}"]) == (
        f"--model.tokenizer_path='{path}': not an HF tokenizer.json: not a text file (not UTF-8); {TOKENIZER_FIX}"
    )


def test_folder_whose_tokenizer_json_is_bad_names_the_file(tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"added_tokens": []}')
    assert check_error([f"--model.tokenizer_path={tmp_path}"]) == (
        f"--model.tokenizer_path='{tmp_path}': not an HF tokenizer.json ('{tmp_path}/tokenizer.json'): JSON, but no"
        f" tokenizer 'model' in it (its keys: added_tokens); {TOKENIZER_FIX}"
    )


def test_tokenizer_without_bos_eos(tmp_path):
    path = word_tokenizer(tmp_path / "plain.json", ["a", "b", "<unk>"])
    assert check_error([f"--model.tokenizer_path={path}"]) == (
        f"--model.tokenizer_path='{path}': the tokenizer has none of the BOS/EOS token pairs <|begin_of_text|>"
        " <|end_of_text|>, <s> </s>, <|endoftext|>; use a tokenizer that defines one of these pairs (as tokens or"
        " added tokens)"
    )


def test_tokenizer_larger_than_a_fixed_vocabulary(tmp_path):
    path = word_tokenizer(tmp_path / "t.json", ["<s>", "</s>", "a", "b", "<unk>"])
    small = dataclasses.replace(FIXED, vocab_size=4)
    assert check_error([f"--model.tokenizer_path={path}", "--model.flavor=8B"], args=small) == (
        f"--model.tokenizer_path='{path}': the tokenizer has 5 tokens but llama3 8B has only 4 embeddings (its"
        " fixed vocab_size); use the flavor's own tokenizer, or a flavor with vocab_size 0, which takes the"
        f" tokenizer's (here: {OPEN_VOCABULARY_FLAVORS})"
    )
    check_data_inputs(
        cfg_of([f"--model.tokenizer_path={path}"]), dataclasses.replace(FIXED, vocab_size=5)
    )
    check_data_inputs(cfg_of([f"--model.tokenizer_path={path}"]), DEBUG)  # vocab_size 0 takes any


def test_the_check_catches_what_model_args_would_raise(tmp_path):
    """train_spec.model_args keeps its ValueError as a backstop; the check says it first."""
    from torchtitan.models.flavors import model_args

    words = ["<s>", "</s>", *(f"w{i}" for i in range(FIXED.vocab_size)), "<unk>"]
    path = word_tokenizer(tmp_path / "big.json", words)
    msg = config_error([f"--model.tokenizer_path={path}", "--model.flavor=8B"])
    assert msg.startswith(
        f"--model.tokenizer_path='{path}': the tokenizer has {len(words)} tokens but llama3 8B"
        f" has only {FIXED.vocab_size} embeddings"
    )
    with pytest.raises(ValueError):
        model_args("llama3", "8B", len(words), 256)


def test_dry_run_reads_no_tokenizer_for_a_fixed_vocabulary(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text('{"a": 1}')
    check_data_inputs(cfg_of([f"--model.tokenizer_path={path}", "--job.dry_run=true"]), FIXED)
    # a flavor that takes the tokenizer's vocabulary reads it even in a dry run
    msg = check_error([f"--model.tokenizer_path={path}", "--job.dry_run=true"])
    assert "JSON, but no tokenizer 'model' in it" in msg


def test_bundled_and_other_bos_eos_names_pass(tmp_path):
    check_data_inputs(cfg_of([]), DEBUG)
    check_data_inputs(cfg_of([]), FIXED)
    gpt = word_tokenizer(tmp_path / "gpt.json", ["<|endoftext|>", "hi", "<unk>"])
    check_data_inputs(cfg_of([f"--model.tokenizer_path={gpt}"]), DEBUG)


# --------------------------------------------------------------------------- the embedded dataset


@pytest.mark.parametrize("section", ["training", "validation"])
def test_pydoc_split(section):
    enable = ["--validation.enable=true"] if section == "validation" else []
    assert check_error([*enable, f"--{section}.dataset_split=test"]) == (
        f"--{section}.dataset_split='test': the embedded 'pydoc' dataset has the splits train, validation;"
        f" set --{section}.dataset_split=train (or validation, the held-out docstrings)"
    )


def test_validation_keys_are_checked_only_when_enabled():
    check_data_inputs(
        cfg_of(["--validation.dataset_split=nope", "--validation.dataset=./no/such.jsonl"]), DEBUG
    )
    assert check_error(
        ["--validation.enable=true", "--validation.dataset_split=validatoin"]
    ).startswith(
        "--validation.dataset_split='validatoin': the embedded 'pydoc' dataset has the splits train, validation"
        " (did you mean 'validation'?)"
    )
    check_data_inputs(
        cfg_of(["--validation.enable=true"]), DEBUG
    )  # the default: pydoc / validation


def test_pydoc_text_field_and_config_name():
    assert check_error(["--training.dataset_text_field=body"]) == (
        "--training.dataset_text_field='body': the embedded 'pydoc' dataset has only the column text; set"
        " --training.dataset_text_field=text"
    )
    assert check_error(["--training.dataset_config_name=en"]) == (
        "--training.dataset_config_name='en' has no effect on the embedded 'pydoc' dataset (it picks a subset of"
        " a hub dataset); drop it"
    )


def test_pydoc_smaller_than_a_global_batch():
    from torchtitan.data.corpus import pydoc_documents

    n_train, n_val = len(pydoc_documents("train")), len(pydoc_documents("validation"))
    check_data_inputs(cfg_of([]), DEBUG, global_batch=n_train)
    assert check_error([], global_batch=n_train + 1) == (
        f"--training.dataset='pydoc': split 'train' has {n_train} documents, fewer than the {n_train + 1} rows of"
        " a global batch (every row reads its own documents); add documents, or lower --training.local_batch_size"
        " (or --training.global_batch_size)"
    )
    assert check_error(["--validation.enable=true"], global_batch=n_val + 1).startswith(
        f"--validation.dataset='pydoc': split 'validation' has {n_val} documents, fewer than the {n_val + 1} rows"
    )
    # without a given global batch: training.global_batch_size, else local_batch_size
    assert "fewer than the 500 rows" in check_error(["--training.global_batch_size=500"])
    check_data_inputs(cfg_of(["--training.global_batch_size=500", "--job.dry_run=true"]), DEBUG)


# --------------------------------------------------------------------------- local datasets


def test_text_field_missing_lists_the_columns(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "data.jsonl", docs(8))
    assert check_error(["--training.dataset=data.jsonl", "--training.dataset_text_field=body"]) == (
        "--training.dataset_text_field='body': document 0 of 'data.jsonl' has no such column; its columns are: text, id;"
        " set --training.dataset_text_field to the one holding the document text"
    )
    assert check_error(
        ["--training.dataset=data.jsonl", "--training.dataset_text_field=txt"]
    ).startswith(
        "--training.dataset_text_field='txt': document 0 of 'data.jsonl' has no such column (did you mean 'text'?); its columns"
        " are: text, id;"
    )


@pytest.mark.parametrize(
    "value, what",
    [
        (5, "holds int 5, not a string"),
        (["a", "b"], "holds list ['a', 'b'], not a string"),
        (None, "has no text (null or missing)"),
    ],
)
def test_text_that_is_not_a_string(tmp_path, value, what):
    path = write_jsonl(tmp_path / "d.jsonl", [*docs(3), {"text": value, "id": 3}, *docs(4)])
    assert check_error([f"--training.dataset={path}"]) == (
        f"--training.dataset_text_field='text': document 3 of '{path}' {what}; set --training.dataset_text_field to"
        " the column holding the text, or fix that record"
    )


def test_a_record_without_the_field(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [*docs(2), {"id": 2}, *docs(5)])
    # read as the run reads it (its own JSON parse, not Arrow's, which fills a missing column with null)
    assert f"document 2 of '{path}' has no such column; its columns are: id" in check_error(
        [f"--training.dataset={path}"]
    )


@pytest.mark.parametrize(
    "name, content, reason",
    [
        (
            "d.jsonl",
            '{"text": "a"}\n{"text": "b"\n',
            "line 2 is not JSON: Expecting ',' delimiter: line 2 column 1",
        ),
        ("d.json", "this is not json", "ArrowInvalid: JSON parse error: Invalid value. in row 0"),
        (
            "d.parquet",
            "PAR1 but no parquet",
            "ArrowInvalid: Parquet magic bytes not found in footer.",
        ),
    ],
)
def test_unreadable_local_file(tmp_path, capfd, name, content, reason):
    path = tmp_path / name
    path.write_text(content)
    msg = check_error([f"--training.dataset={path}"])
    assert msg.startswith(f"--training.dataset='{path}': cannot read the local file ({reason}")
    assert msg.endswith(
        "); fix the data (its first records are read as the run reads them) or give another"
        " .json/.jsonl/.parquet/.txt/.csv/.arrow file or folder"
    )
    assert capfd.readouterr().err == ""  # datasets' own log line is silenced: the error is one line


@pytest.mark.parametrize("name", ["empty.jsonl", "empty.txt", "empty.csv"])
def test_empty_file(tmp_path, name):
    path = tmp_path / name
    path.write_text("")
    msg = check_error([f"--training.dataset={path}"])
    assert msg.startswith(f"--training.dataset='{path}': ")
    assert (
        "no documents in split 'train' (the file is empty)" in msg
        or "cannot read the local file" in msg
    )


def test_fewer_documents_than_the_global_batch(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", docs(3))
    assert check_error(
        [f"--training.dataset={path}", "--training.local_batch_size=2"], global_batch=4
    ) == (
        f"--training.dataset='{path}': split 'train' has 3 documents, fewer than the 4 rows of a global batch"
        " (every row reads its own documents); add documents, or lower --training.local_batch_size (or"
        " --training.global_batch_size)"
    )
    check_data_inputs(cfg_of([f"--training.dataset={path}"]), DEBUG, global_batch=3)


def test_validate_passes_the_global_batch_of_the_world(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", docs(6))
    config_error_msg = config_error(
        [f"--training.dataset={path}", "--training.local_batch_size=2"], world_size=4
    )
    assert "has 6 documents, fewer than the 8 rows of a global batch" in config_error_msg
    from torchtitan.checks import load_config

    load_config([f"--training.dataset={path}", "--training.local_batch_size=2"], 3)


def test_only_the_first_global_batch_of_records_is_checked(tmp_path):
    """A big local dataset does not slow start-up: the check reads one global batch of rows."""
    path = write_jsonl(tmp_path / "d.jsonl", [*docs(4), *({"id": i} for i in range(20000))])
    start = time.perf_counter()
    check_data_inputs(cfg_of([f"--training.dataset={path}"]), DEBUG, global_batch=4)
    assert time.perf_counter() - start < 5
    assert "document 4 of" in check_error([f"--training.dataset={path}"], global_batch=5)


def test_split_of_a_local_file(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", docs(8))
    assert check_error([f"--training.dataset={path}", "--training.dataset_split=validation"]) == (
        f"--training.dataset_split='validation': the local file '{path}' has only the split 'train'; set"
        " --training.dataset_split=train"
    )
    # [validation] defaults to the split 'validation', which a local file does not have
    assert check_error(["--validation.enable=true", f"--validation.dataset={path}"]) == (
        f"--validation.dataset_split='validation': the local file '{path}' has only the split 'train'; set"
        " --validation.dataset_split=train"
    )
    check_data_inputs(
        cfg_of(
            [
                "--validation.enable=true",
                f"--validation.dataset={path}",
                "--validation.dataset_split=train",
            ]
        ),
        DEBUG,
    )


def test_local_folder(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    assert check_error([f"--training.dataset={folder}"]) == (
        f"--training.dataset='{folder}': the folder holds no data files (looked for"
        " .json/.jsonl/.parquet/.txt/.csv/.arrow); put the data files in it or give one file"
    )
    write_jsonl(folder / "train.jsonl", docs(8))
    write_jsonl(folder / "validation.jsonl", docs(8))
    check_data_inputs(
        cfg_of(
            [
                f"--training.dataset={folder}",
                "--validation.enable=true",
                f"--validation.dataset={folder}",
            ]
        ),
        DEBUG,
    )
    assert check_error([f"--training.dataset={folder}", "--training.dataset_split=tests"]) == (
        f"--training.dataset_split='tests': the local folder '{folder}' has only the split(s) train, validation"
        " (one per file name: train.jsonl, validation.jsonl, ...); set --training.dataset_split to one of them"
    )
    assert check_error(
        [
            "--validation.enable=true",
            f"--validation.dataset={folder}",
            "--validation.dataset_text_field=body",
        ]
    ).startswith(
        f"--validation.dataset_text_field='body': document 0 of '{folder}' has no such column; its columns are: text, id;"
    )
    # splits whose columns differ: datasets casts every split to the first one's columns
    write_jsonl(folder / "validation.jsonl", docs(8, field="body"))
    assert check_error(["--validation.enable=true", f"--validation.dataset={folder}"]).startswith(
        f"--validation.dataset='{folder}': cannot read the local folder (CastError: Couldn't cast"
    )


def test_csv_and_txt_columns(tmp_path):
    csv = tmp_path / "d.csv"
    csv.write_text("title,body\n" + "".join(f"t{i},b{i}\n" for i in range(8)))
    assert check_error([f"--training.dataset={csv}"]).startswith(
        f"--training.dataset_text_field='text': document 0 of '{csv}' has no such column; its columns are: title, body;"
    )
    check_data_inputs(
        cfg_of([f"--training.dataset={csv}", "--training.dataset_text_field=body"]), DEBUG
    )
    txt = tmp_path / "d.txt"
    txt.write_text("".join(f"line {i}\n" for i in range(8)))
    check_data_inputs(cfg_of([f"--training.dataset={txt}"]), DEBUG)


def test_config_name_has_no_effect_on_a_local_dataset(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", docs(8))
    assert check_error([f"--training.dataset={path}", "--training.dataset_config_name=en"]) == (
        f"--training.dataset_config_name='en' has no effect on the local dataset '{path}' (it picks a subset of a"
        " hub dataset); drop it"
    )


def test_dry_run_reads_no_data(tmp_path, monkeypatch):
    path = write_jsonl(tmp_path / "d.jsonl", docs(1, field="body"))
    check_data_inputs(cfg_of([f"--training.dataset={path}", "--job.dry_run=true"]), DEBUG)
    monkeypatch.setattr(
        hub_check, "read_records", lambda *a: pytest.fail("a dry run reads no hub data")
    )
    check_data_inputs(cfg_of(["--training.dataset=allenai/c4", "--job.dry_run=true"]), DEBUG)
