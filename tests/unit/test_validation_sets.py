"""[validation] per_source: held-out sets measured one by one, named, read with their own split rule."""

import json

import pytest

from torchtitan.checks import load_config
from torchtitan.config import ConfigError
from torchtitan.data.tokenizer import Tokenizer
from torchtitan.data.validation import Validator, per_source_sets


def _jsonl(path, n, word):
    path.write_text("".join(json.dumps({"text": f"{word} {i} " * 30}) + "\n" for i in range(n)))
    return str(path)


def test_entries_are_named_after_their_file_unless_named(tmp_path):
    web = _jsonl(tmp_path / "web.jsonl", 2, "w")
    assert per_source_sets([web, "code=hub/code", "pydoc"]) == [
        ("web", web),
        ("code", "hub/code"),
        ("pydoc", "pydoc"),
    ]


def test_each_set_is_measured_on_its_own_batches(tmp_path):
    web, code = (
        _jsonl(tmp_path / "web.jsonl", 8, "alpha"),
        _jsonl(tmp_path / "code.jsonl", 8, "beta"),
    )
    cfg, _ = load_config(
        [
            "--training.local_batch_size=2",
            "--training.seq_len=16",
            "--validation.enable=true",
            "--validation.steps=1",
            f"--validation.per_source={web},c={code}",
        ],
        1,
    )
    v = Validator(cfg, Tokenizer(), dp_rank=0, dp_degree=1, accum_steps=1)
    assert list(v.sets) == ["", "web", "c"]
    assert v.sets["web"].dataset_split == "train" and v.sets[""].dataset_split == "validation"
    first_token = {name: int(v.batches(name)[0][0][0][0, 1]) for name in v.sets}
    assert len(set(first_token.values())) == 3  # three different documents start the three sets
    out = v.measure(lambda batches: float(batches[0][0][0, 1]))
    assert (
        out["validation_loss/web"] == first_token["web"]
        and out["validation_loss/c"] == first_token["c"]
    )
    assert out["validation_loss"] == first_token[""]
    assert set(out) == {
        "validation_loss",
        "validation_perplexity",
        "validation_loss/web",
        "validation_perplexity/web",
        "validation_loss/c",
        "validation_perplexity/c",
    }


def test_a_missing_per_source_set_is_one_line_naming_the_entry(tmp_path):
    missing = str(tmp_path / "nope.jsonl")
    with pytest.raises(ConfigError) as info:
        load_config(["--validation.enable=true", f"--validation.per_source={missing}"], 1)
    assert str(info.value).startswith(
        f"--validation.per_source entry '{missing}': local dataset path '{missing}' does not exist"
    )
