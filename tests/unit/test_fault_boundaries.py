"""Where an exception is caught on purpose, only the faults of the input it names become one
line: a user's model module that cannot be imported, a safetensors file that does not read, a
Hugging Face write that fails on disk. A bug (here planted by the test) keeps its traceback,
through the pre-launch checks, the folder checks and the exports; a conversion that stops
leaves no partial folder behind. (The layout search's forked simulations hand every exception
to the parent with its traceback: planning/search/child.py's `in_child`.)"""

import dataclasses
import os

import pytest
import torch
from config_helpers import config_error

from torchtitan import hf_convert
from torchtitan.checks import layout, load_config
from torchtitan.data.tokenizer import Tokenizer
from torchtitan.models.flavors import flavors_of, model_args
from torchtitan.models.hf import weights as hf_weights
from torchtitan.models.hf.folder import HFFolderError, tensor_shapes, weight_map
from torchtitan.models.llama3 import hf_convert as llama3_hf
from torchtitan.models.llama3.model import Transformer

SEQ = 32


def _planted_bug(*args, **kwargs):
    raise ZeroDivisionError("a bug planted by the test")


@pytest.fixture(scope="module")
def tiny():
    tok = Tokenizer("")
    args = model_args("llama3", "tiny", tok.vocab_size, SEQ)
    model = Transformer(args)
    model.init_weights(0, torch.device("cpu"))
    export_args = dataclasses.replace(args, max_seq_len=flavors_of("llama3")["tiny"].max_seq_len)
    return tok, args, export_args, model


def _hf_folder(model, folder, export_args, tok) -> str:
    os.makedirs(folder)
    writer = hf_weights.ShardWriter(str(folder), "model", 1 << 30)
    params = ((k, v.detach()) for k, v in model.named_parameters())
    hf_weights.convert_full(params, "llama3", export_args, "float32", writer)
    config = llama3_hf.hf_config(export_args, "float32", tok.bos_id, tok.eos_id)
    hf_weights.write_metadata(str(folder), config, writer.weight_map, writer.total_bytes, tok.path)
    return str(folder)


# --------------------------------------------------------------------------- the pre-launch checks


def test_a_model_module_whose_own_code_fails_keeps_its_traceback(tmp_path, monkeypatch):
    (tmp_path / "buggy_models.py").write_text("def fail():\n    return 1 / 0\n\n\nfail()\n")
    (tmp_path / "needy_models.py").write_text("import no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ZeroDivisionError) as info:
        load_config(["--model.module=buggy_models"], 1)
    assert info.traceback[-1].name == "fail"
    # one that cannot be imported stays one line (SyntaxError, register's ValueError: test_checks.py)
    assert config_error(["--model.module=needy_models"]).startswith(
        "--model.module='needy_models': cannot import it (No module named 'no_such_dependency')"
    )


def test_a_bug_in_a_layout_check_keeps_its_traceback(monkeypatch):
    monkeypatch.setattr(layout, "check_moe", _planted_bug)
    with pytest.raises(ZeroDivisionError) as info:
        load_config([], 1)
    assert info.traceback[-1].name == "_planted_bug"


# --------------------------------------------------------------------------- Hugging Face folders


def test_an_unreadable_safetensors_file_is_one_line_and_a_bug_is_not(tmp_path, monkeypatch):
    import safetensors

    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors header")
    with pytest.raises(HFFolderError, match="is not a readable safetensors file") as info:
        weight_map(str(tmp_path), "key")
    assert "\n" not in str(info.value)
    good = tmp_path / "good"
    good.mkdir()
    from safetensors.torch import save_file

    save_file({"a": torch.zeros(2, 3)}, str(good / "model.safetensors"))
    wmap = weight_map(str(good), "key")
    assert tensor_shapes(wmap, ["a"], "key") == {"a": (2, 3)}
    with pytest.raises(HFFolderError, match="or lacks a tensor its index names"):
        tensor_shapes({"b": wmap["a"]}, ["b"], "key")
    monkeypatch.setattr(safetensors, "safe_open", _planted_bug)
    for read in (lambda: weight_map(str(good), "key"), lambda: tensor_shapes(wmap, ["a"], "key")):
        with pytest.raises(ZeroDivisionError):
            read()


def test_a_shard_write_keeps_disk_faults_and_raises_bugs(tmp_path):
    missing = hf_weights.ShardWriter(str(tmp_path / "gone"), "model", 1 << 20)
    missing.add("a", torch.zeros(3))
    missing.flush()  # safetensors' own error, wrapping the I/O error
    assert missing.error.startswith("writing model-0000.safetensors failed (SafetensorError:")
    writer = hf_weights.ShardWriter(str(tmp_path), "model", 1 << 20)
    writer.add("a", torch.zeros(3, 4).t())  # not contiguous: convert_full's job, a bug here
    with pytest.raises(ValueError, match="non contiguous"):
        writer.flush()
    assert writer.error == ""


def test_a_bug_on_rank_0_of_an_export_keeps_its_traceback(tiny, tmp_path, gloo_world, monkeypatch):
    tok, _, export_args, model = tiny
    spec = hf_weights.HFSpec(
        "llama3", export_args, tok.bos_id, tok.eos_id, tok.path, writes=True, stage=0
    )
    monkeypatch.setattr(llama3_hf, "hf_config", _planted_bug)
    folder = str(tmp_path / "step-1")
    with pytest.raises(ZeroDivisionError) as info:
        hf_weights.export_hf([model], folder, spec, "float32")
    assert info.traceback[-1].name == "_planted_bug"
    assert os.listdir(tmp_path) == []  # neither the folder nor its .tmp


def test_an_import_that_stops_leaves_no_partial_folder(tiny, tmp_path, monkeypatch):
    tok, _, export_args, model = tiny
    folder = _hf_folder(model, tmp_path / "hf", export_args, tok)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(hf_convert, "write_marker", interrupted)
    with pytest.raises(KeyboardInterrupt):
        hf_convert.import_folder(folder, str(tmp_path / "step-0"), "llama3", "tiny")
    assert sorted(os.listdir(tmp_path)) == ["hf"]
