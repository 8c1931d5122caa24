"""Qwen3 dense and MoE against transformers' Qwen3ForCausalLM / Qwen3MoeForCausalLM on the
same weights: a transformers-written folder imported (logits, argmax, the MoE balance loss),
exported back bitwise, transformers 5's fused expert layout, tied embeddings written once, and
one-line refusals of a folder of another shape."""

import dataclasses
import json
import os

import pytest
import torch

from torchtitan.data.tokenizer import Tokenizer
from torchtitan.models.common.moe import moe_aux_loss
from torchtitan.models.flavors import model_args
from torchtitan.models.hf import weights as hf_weights
from torchtitan.models.hf.folder import HFFolderError, check_folder, weight_map
from torchtitan.models.qwen3 import hf_convert
from torchtitan.models.qwen3.model import Transformer

SEQ = 32


def _args(flavor, **changes):
    args = model_args("qwen3", flavor, Tokenizer("").vocab_size, SEQ)
    return dataclasses.replace(args, max_seq_len=SEQ, **changes)


def _hf_model(args, seed=0):
    """A random transformers model of these shapes (router weights scaled up: at std 0.02 the
    top-k is nearly tied and flips between implementations)."""
    import transformers

    config = hf_convert.hf_config(args, "float32", 1, 2)
    config.pop("architectures")
    cls = transformers.Qwen3MoeForCausalLM if args.moe else transformers.Qwen3ForCausalLM
    conf_cls = transformers.Qwen3MoeConfig if args.moe else transformers.Qwen3Config
    torch.manual_seed(seed)
    model = cls(
        conf_cls(**{k: v for k, v in config.items() if k not in ("model_type", "torch_dtype")})
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.mul_(50.0)
            if "norm" in name:  # norms start at 1: make their permutation matter
                p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def _ours(args, folder):
    model = Transformer(args)
    model.init_weights(0, torch.device("cpu"))
    load = hf_weights.load_hf_weights([model], folder, "qwen3", args)
    return model, load


def _tokens(vocab):
    return torch.randint(0, vocab, (2, SEQ), generator=torch.Generator().manual_seed(1))


def _compare(ours, theirs, what):
    diff = (ours - theirs).abs().max().item()
    same = (ours.argmax(-1) == theirs.argmax(-1)).float().mean().item()
    print(f"{what}: max |ours - transformers| = {diff:.3g}, same argmax {same:.1%}")
    assert diff <= 1e-5 and same == 1.0, (diff, same)


def _export(model, args, folder):
    os.makedirs(folder)
    writer = hf_weights.ShardWriter(str(folder), "model", 1 << 30)
    hf_weights.convert_full(
        hf_weights.checkpointed_tensors(model, hf_convert), "qwen3", args, "float32", writer
    )
    assert not writer.error, writer.error
    hf_weights.write_metadata(
        str(folder),
        hf_convert.hf_config(args, "float32", 1, 2),
        writer.weight_map,
        writer.total_bytes,
        None,
    )
    return str(folder)


def _tensors(folder):
    from safetensors.torch import load_file

    out = {}
    for file in sorted(set(weight_map(folder, "k").values())):
        out.update(load_file(file))
    return out


@pytest.mark.parametrize("flavor", ["tiny", "tiny_untied", "tiny_moe"])
def test_transformers_folder_gives_the_same_logits_and_exports_back_bitwise(tmp_path, flavor):
    args = _args(flavor)
    hf = _hf_model(args)
    hf.save_pretrained(tmp_path / "hf")
    check_folder(str(tmp_path / "hf"), "qwen3", flavor, args)
    model, load = _ours(args, str(tmp_path / "hf"))
    assert load.tensors == len(list(model.parameters()))
    tokens = _tokens(args.vocab_size)
    with torch.no_grad():
        theirs = hf(tokens).logits
        ours = model.eval()(tokens)
    _compare(ours, theirs, f"qwen3 {flavor}")
    # back out: every tensor the hub layout holds, bitwise; a tied head written once
    folder = _export(model, args, tmp_path / "out")
    written, stored = _tensors(folder), _tensors(str(tmp_path / "hf"))
    assert set(written) == set(stored), set(written) ^ set(stored)
    assert all(torch.equal(written[n], stored[n]) for n in stored)
    assert ("lm_head.weight" in written) == (not args.tie_word_embeddings)
    config = json.load(open(os.path.join(folder, "config.json")))
    assert config["architectures"] == ["Qwen3MoeForCausalLM" if args.moe else "Qwen3ForCausalLM"]


def test_moe_balance_loss_equals_transformers(tmp_path):
    args = _args("tiny_moe")
    hf = _hf_model(args)
    hf.save_pretrained(tmp_path / "hf")
    model, _ = _ours(args, str(tmp_path / "hf"))
    tokens = _tokens(args.vocab_size)
    out = hf(tokens, output_router_logits=True)
    logits = model.train()(tokens)  # training forwards keep the routing statistics
    ours = moe_aux_loss(model)
    theirs = args.aux_loss_coeff * out.aux_loss
    print(f"aux loss: ours {ours.item():.9f}, transformers {theirs.item():.9f}")
    assert abs(ours.item() - theirs.item()) <= 1e-9 + 1e-6 * abs(theirs.item())
    _compare(logits.detach(), out.logits.detach(), "qwen3 tiny_moe (train mode)")
    # only the probabilities carry a gradient: the head and the last layer's experts get none
    ours.backward()
    assert model.layers["3"].moe.router.gate.weight.grad is not None
    assert (
        model.layers["3"].moe.experts.w1.grad is None
        and model.tok_embeddings.weight.grad is not None
    )


def test_fused_expert_folder_reads_the_same_weights(tmp_path):
    from safetensors.torch import save_file

    args = _args("tiny_moe")
    hf = _hf_model(args)
    hf.save_pretrained(tmp_path / "hub")
    fused = {
        n: t.contiguous() for n, t in hf.state_dict().items()
    }  # transformers 5's in-memory names
    assert any(n.endswith("mlp.experts.gate_up_proj") for n in fused)
    os.makedirs(tmp_path / "fused")
    save_file(fused, str(tmp_path / "fused" / "model.safetensors"))
    with open(tmp_path / "fused" / "config.json", "w") as f:
        json.dump(hf_convert.hf_config(args, "float32", 1, 2), f)
    check_folder(str(tmp_path / "fused"), "qwen3", "tiny_moe", args)
    a, _ = _ours(args, str(tmp_path / "hub"))
    b, _ = _ours(args, str(tmp_path / "fused"))
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


def test_expert_parallel_rank_reads_only_its_experts(tmp_path):
    args = _args("tiny_moe")
    hf = _hf_model(args)
    hf.save_pretrained(tmp_path / "hf")
    reader = hf_weights.FolderReader(weight_map(str(tmp_path / "hf"), "k"))
    full = hf_convert.read_local("layers.1.moe.experts.w1", args, reader, None)
    before = reader.bytes_read
    half = hf_convert.read_local(
        "layers.1.moe.experts.w1", args, reader, [torch.arange(4, 8), None, None]
    )
    assert torch.equal(half, full[4:8])
    assert reader.bytes_read - before == full[4:8].numel() * 4  # 4 of 8 experts' bytes, no more


def test_folder_of_another_shape_is_refused_in_one_line(tmp_path):
    args = _args("tiny")
    _hf_model(dataclasses.replace(args, head_dim=16)).save_pretrained(tmp_path / "hf")
    with pytest.raises(HFFolderError) as e:
        check_folder(str(tmp_path / "hf"), "qwen3", "tiny", args)
    msg = str(e.value)
    assert (
        "\n" not in msg
        and "head_dim=16 (ours: 32)" in msg
        and "--checkpoint.initial_load_path" in msg
    )
