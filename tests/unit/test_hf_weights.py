"""Hugging Face weights: names and RoPE rows converted both ways, transformers' own
LlamaForCausalLM as the oracle, folder checks with one-line errors, checkpoint export."""

import dataclasses
import json
import os

import pytest
import torch

from torchtitan import hf_convert as checkpoint_hf
from torchtitan.data.tokenizer import Tokenizer
from torchtitan.models.flavors import flavors_of, model_args
from torchtitan.models.hf import weights as hf_weights
from torchtitan.models.hf.folder import HFFolderError, check_folder, is_hf_folder
from torchtitan.models.llama3 import hf_convert
from torchtitan.models.llama3.model import Transformer

SEQ = 32


@pytest.fixture(scope="module")
def tiny():
    tok = Tokenizer("")
    args = model_args("llama3", "tiny", tok.vocab_size, SEQ)
    model = Transformer(args)
    model.init_weights(0, torch.device("cpu"))
    export_args = dataclasses.replace(args, max_seq_len=flavors_of("llama3")["tiny"].max_seq_len)
    return tok, args, export_args, model


def _export(model, folder, export_args, tok, shard_bytes=1 << 30, drop=()):
    os.makedirs(folder)
    writer = hf_weights.ShardWriter(str(folder), "model", shard_bytes)
    params = ((k, v.detach()) for k, v in model.named_parameters() if k not in drop)
    hf_weights.convert_full(params, "llama3", export_args, "float32", writer)
    config = hf_convert.hf_config(export_args, "float32", tok.bos_id, tok.eos_id)
    hf_weights.write_metadata(str(folder), config, writer.weight_map, writer.total_bytes, tok.path)
    return str(folder)


def _tokens(vocab):
    return torch.randint(0, vocab, (2, SEQ), generator=torch.Generator().manual_seed(0))


def test_rope_rows_round_trip_and_pair_up_as_rotate_half():
    args = flavors_of("llama3")["tiny"]
    w = torch.arange(args.n_heads * args.head_dim * 3, dtype=torch.float32).view(-1, 3)
    hf = hf_convert.to_hf("layers.0.attention.wq.weight", w, args)
    assert torch.equal(hf_convert.from_hf("layers.0.attention.wq.weight", hf, args), w)
    half = args.head_dim // 2
    # Head 1, pair j=2 of ours (rows 2j, 2j+1) -> HF rows j and j + head_dim/2 of that head.
    base = args.head_dim
    assert torch.equal(hf[base + 2], w[base + 4]) and torch.equal(hf[base + 2 + half], w[base + 5])
    wv = torch.randn(args.n_kv_heads * args.head_dim, 3)
    assert hf_convert.to_hf("layers.0.attention.wv.weight", wv, args) is wv  # only q and k move


def test_every_parameter_has_a_distinct_hf_name_with_the_flavor_shape(tiny):
    _, args, _, model = tiny
    names = {hf_convert.hf_name(k): tuple(v.shape) for k, v in model.named_parameters()}
    assert names == hf_convert.hf_shapes(args)


def test_transformers_loads_the_export_with_our_logits_and_import_restores_them(tiny, tmp_path):
    from transformers import LlamaForCausalLM

    tok, args, export_args, model = tiny
    folder = _export(
        model, tmp_path / "hf", export_args, tok, shard_bytes=200_000
    )  # several files + index
    assert (
        is_hf_folder(folder)
        and len([f for f in os.listdir(folder) if f.endswith(".safetensors")]) > 1
    )
    tokens = _tokens(args.vocab_size)
    hf = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        ours, theirs = model(tokens), hf(tokens).logits
    diff = (ours - theirs).abs().max().item()
    print(f"max |our logits - transformers logits| = {diff:.3g}")
    assert diff < 1e-5
    fresh = Transformer(args)
    fresh.init_weights(1, torch.device("cpu"))  # other weights, all overwritten
    assert hf_weights.load_hf_weights([fresh], folder, "llama3", args).tensors == len(
        list(model.parameters())
    )
    with torch.no_grad():
        assert torch.equal(fresh(tokens), ours)


def test_tied_model_takes_its_output_from_the_embedding(tiny, tmp_path):
    tok, args, export_args, model = tiny
    folder = _export(model, tmp_path / "tied", export_args, tok, drop=("output.weight",))
    check_folder(folder, "llama3", "tiny", args)
    fresh = Transformer(args)
    hf_weights.load_hf_weights([fresh], folder, "llama3", args)
    assert torch.equal(fresh.output.weight, model.tok_embeddings.weight)


def test_folder_checks_name_the_key_and_the_fix(tiny, tmp_path):
    tok, args, export_args, model = tiny
    folder = _export(model, tmp_path / "hf", export_args, tok)
    check_folder(folder, "llama3", "tiny", args)
    with pytest.raises(
        HFFolderError,
        match=r"holds another model than llama3 debugmodel: hidden_size=64 \(ours: 256\)",
    ):
        check_folder(
            folder,
            "llama3",
            "debugmodel",
            dataclasses.replace(flavors_of("llama3")["debugmodel"], vocab_size=args.vocab_size),
        )
    ds_args = dataclasses.replace(
        flavors_of("deepseek_v3")["debugmodel"], vocab_size=args.vocab_size
    )
    with pytest.raises(
        HFFolderError,
        match=r"holds another model than deepseek_v3 debugmodel: model_type='llama'"
        r" \(ours: 'deepseek_v3'\)",
    ):
        check_folder(folder, "deepseek_v3", "debugmodel", ds_args)
    # config.json agrees but a tensor has another shape (an edited or foreign checkpoint)
    config = json.load(open(os.path.join(folder, "config.json")))
    del config["intermediate_size"]
    json.dump(config, open(os.path.join(folder, "config.json"), "w"))
    with pytest.raises(
        HFFolderError,
        match=r"--checkpoint.initial_load_path: tensor 'model.layers.0.mlp.gate_proj.weight'"
        r" in '.*' has shape \[192, 64\], llama3 tiny needs \[256, 64\]",
    ):
        check_folder(folder, "llama3", "tiny", dataclasses.replace(args, multiple_of=256))
    config["attention_bias"] = True  # Qwen-like: biases our attention has no place for
    json.dump(config, open(os.path.join(folder, "config.json"), "w"))
    with pytest.raises(HFFolderError, match=r"attention_bias=True \(ours: False\)"):
        check_folder(folder, "llama3", "tiny", dataclasses.replace(args, multiple_of=256))
    del config["attention_bias"]
    json.dump(config, open(os.path.join(folder, "config.json"), "w"))
    from safetensors.torch import save_file

    save_file(
        {"model.layers.0.self_attn.q_proj.bias": torch.zeros(64)},
        os.path.join(folder, "extra.safetensors"),
    )
    index = os.path.join(folder, "model.safetensors.index.json")
    data = json.load(open(index))
    data["weight_map"]["model.layers.0.self_attn.q_proj.bias"] = "extra.safetensors"
    json.dump(data, open(index, "w"))
    with pytest.raises(
        HFFolderError,
        match=r"holds 1 tensor\(s\) llama3 tiny has no place for, e.g."
        r" 'model.layers.0.self_attn.q_proj.bias'",
    ):
        check_folder(folder, "llama3", "tiny", args)
    del data["weight_map"]["model.layers.0.self_attn.q_proj.bias"]
    json.dump(data, open(index, "w"))
    data = json.load(open(index))
    data["weight_map"]["model.norm.weight"] = "model-9999.safetensors"
    json.dump(data, open(index, "w"))
    with pytest.raises(
        HFFolderError,
        match="names 1 missing file.*'model-9999.safetensors'; the download is incomplete",
    ):
        check_folder(folder, "llama3", "tiny", args)
    del data["weight_map"]["model.norm.weight"]
    json.dump(data, open(index, "w"))
    with pytest.raises(
        HFFolderError, match="has no tensor 'model.norm.weight'; it is not a complete checkpoint"
    ):
        check_folder(folder, "llama3", "tiny", args)


def test_a_saved_checkpoint_exports_like_the_model(tiny, tmp_path):
    import torch.distributed.checkpoint as dcp

    from torchtitan.checkpoint.files import write_marker

    tok, args, export_args, model = tiny
    ckpt = tmp_path / "step-0"
    state = {k: v.detach().clone() for k, v in model.named_parameters()}
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.save({"model": state}, checkpoint_id=str(ckpt), no_dist=True)
    write_marker(
        str(ckpt), {"step": 0, "model_only": True, "dtype": "float32", "model": "llama3/tiny"}
    )
    out = checkpoint_hf.export_checkpoint(str(ckpt), str(tmp_path / "out"), dtype="bfloat16")
    assert json.load(open(os.path.join(out, "config.json")))["torch_dtype"] == "bfloat16"
    fresh = Transformer(args)
    hf_weights.load_hf_weights([fresh], out, "llama3", args)
    assert torch.equal(fresh.tok_embeddings.weight, model.tok_embeddings.weight.bfloat16().float())
    assert not os.path.exists(out + ".tmp")


def test_export_writes_atomically_and_fails_alike_on_every_rank(
    tiny, tmp_path, gloo_world, monkeypatch
):
    tok, args, export_args, model = tiny
    spec = hf_weights.HFSpec(
        "llama3", export_args, tok.bos_id, tok.eos_id, tok.path, writes=True, stage=0
    )
    folder = str(tmp_path / "hf" / "step-3")
    os.makedirs(os.path.dirname(folder))
    assert hf_weights.export_hf([model], folder, spec, "float32") == folder
    assert sorted(os.listdir(folder)) == [
        "config.json",
        "model-pp00-0000.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
    ]
    check_folder(folder, "llama3", "tiny", args)

    # A write that fails (here: the disk is full) fails the export on every rank, leaving nothing.
    def full_disk(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("safetensors.torch.save_file", full_disk)
    other = str(tmp_path / "hf" / "step-4")
    with pytest.raises(
        hf_weights.HFExportError,
        match=r"^--checkpoint.last_save_in_hf: the Hugging Face export to"
        r" '.*step-4' failed \(rank 0: writing model-pp00-0000.safetensors"
        r" failed \(OSError: \[Errno 28\] No space left on device\)\)",
    ):
        hf_weights.export_hf([model], other, spec, "float32")
    assert sorted(os.listdir(tmp_path / "hf")) == ["step-3"]


def test_a_folder_imports_as_a_model_only_checkpoint_and_exports_back_bitwise(tiny, tmp_path):
    """scripts/convert_hf.py's folder -> DCP direction (Llama3): the trainer's model-only format,
    and the export of it gives back the folder's tensors and config bitwise; a wrong flavor is
    refused before anything is written."""
    from safetensors.torch import load_file

    from torchtitan.checkpoint.files import read_marker

    tok, args, export_args, model = tiny
    folder = _export(model, tmp_path / "hf", export_args, tok)
    with pytest.raises(HFFolderError, match="holds another model than llama3 debugmodel"):
        checkpoint_hf.import_folder(folder, str(tmp_path / "bad"), "llama3", "debugmodel")
    assert not os.path.exists(tmp_path / "bad") and not os.path.exists(tmp_path / "bad.tmp")
    ckpt, done = checkpoint_hf.import_folder(folder, str(tmp_path / "step-0"), "llama3", "tiny")
    assert done.tensors == len(list(model.parameters())) and not os.path.exists(ckpt + ".tmp")
    marker = read_marker(ckpt)
    assert (marker["model"], marker["model_only"], marker["dtype"]) == (
        "llama3/tiny",
        True,
        "float32",
    ), marker
    back = checkpoint_hf.export_checkpoint(ckpt, str(tmp_path / "back"))
    ours, theirs = load_file(os.path.join(folder, "model-0000.safetensors")), {}
    for file in os.listdir(back):
        if file.endswith(".safetensors"):
            theirs.update(load_file(os.path.join(back, file)))
    assert sorted(ours) == sorted(theirs) and all(ours[k].equal(theirs[k]) for k in ours)
    assert json.load(open(os.path.join(back, "config.json"))) == json.load(
        open(os.path.join(folder, "config.json"))
    )
