"""DeepSeek-V3 Hugging Face weights: transformers' DeepseekV3ForCausalLM as the oracle both
ways, the YaRN rule taken from the folder (below and above original_seq_len), block-wise
FP8 import, transformers 5's fused expert layout, per-expert reads, one-line refusals."""

import dataclasses
import json
import os

import pytest
import torch

from torchtitan import hf_convert as checkpoint_hf
from torchtitan.data.tokenizer import Tokenizer
from torchtitan.models.deepseek_v3 import hf_convert
from torchtitan.models.deepseek_v3.model import Transformer, softmax_scale
from torchtitan.models.flavors import flavors_of, model_args
from torchtitan.models.hf import weights as hf_weights
from torchtitan.models.hf.folder import HFFolderError, check_folder, weight_map
from torchtitan.training.model_args import initial_rules

FLAVOR = flavors_of("deepseek_v3")[
    "tiny"
]  # original_seq_len 64, YaRN factor 4, 2 groups of 4 experts


def _model(args, seed=0):
    model = Transformer(args)
    model.init_weights(seed, torch.device("cpu"))
    gen = torch.Generator().manual_seed(seed + 7)
    for m in model.modules():  # a trained selection bias, so that it matters for routing
        if hasattr(m, "expert_bias"):
            m.expert_bias.copy_(torch.randn(m.expert_bias.shape, generator=gen) * 0.05)
    return model.eval()


def _args(seq, **changes):
    return dataclasses.replace(
        model_args("deepseek_v3", "tiny", Tokenizer("").vocab_size, seq), **changes
    )


def _export(model, args, folder, shard_bytes=1 << 30, dtype="float32"):
    os.makedirs(folder)
    tok = Tokenizer("")
    export = hf_convert.export_args(args, FLAVOR.max_seq_len)
    writer = hf_weights.ShardWriter(str(folder), "model", shard_bytes)
    hf_weights.convert_full(
        hf_weights.checkpointed_tensors(model, hf_convert), "deepseek_v3", export, dtype, writer
    )
    assert not writer.error, writer.error
    hf_weights.write_metadata(
        str(folder),
        hf_convert.hf_config(export, dtype, tok.bos_id, tok.eos_id),
        writer.weight_map,
        writer.total_bytes,
        None,
    )
    return str(folder)


def _tokens(vocab, seq):
    return torch.randint(0, vocab, (2, seq), generator=torch.Generator().manual_seed(1))


def _hf_logits(folder, tokens):
    from transformers import DeepseekV3ForCausalLM

    hf = DeepseekV3ForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(tokens).logits


def _compare(ours, theirs, what):
    diff = (ours - theirs).abs().max().item()
    same = (ours.argmax(-1) == theirs.argmax(-1)).float().mean().item()
    print(f"{what}: max |ours - transformers| = {diff:.3g}, same argmax {same:.1%}")
    assert diff < 1e-5 and same == 1.0
    return diff


@pytest.mark.parametrize("q_lora_rank", [0, 16], ids=["plain_wq", "q_lora"])
def test_export_matches_transformers_and_import_is_bitwise(tmp_path, q_lora_rank):
    args = _args(128, q_lora_rank=q_lora_rank)  # seq 128 > original 64: YaRN on (reference rule)
    model = _model(args)
    folder = _export(model, args, tmp_path / "hf", shard_bytes=300_000)  # several files + index
    config = json.load(open(os.path.join(folder, "config.json")))
    assert config["rope_scaling"]["mscale_all_dim"] == config["rope_scaling"]["mscale"] == 1.0
    assert config["q_lora_rank"] == (q_lora_rank or None) and config["topk_method"] == "noaux_tc"
    tokens = _tokens(args.vocab_size, 128)
    with torch.no_grad():
        ours = model(tokens)
    _compare(
        ours, _hf_logits(folder, tokens), f"tiny DeepSeek-V3 (q_lora_rank={q_lora_rank}) exported"
    )
    check_folder(folder, "deepseek_v3", "tiny", args)
    fresh = _model(args, seed=3)
    done = hf_weights.load_hf_weights([fresh], folder, "deepseek_v3", args)
    assert (
        done.tensors == len(list(model.parameters())) + args.n_layers - args.n_dense_layers
    )  # + expert_bias
    for (name, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(a, b), name
    with torch.no_grad():
        assert torch.equal(fresh(tokens), ours)


def _transformers_folder(tmp_path, rope: dict | None, name="theirs"):
    """A folder transformers writes itself (save_pretrained) for the tiny shapes."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    args = _args(128)
    config = hf_convert.hf_config(hf_convert.export_args(args, 512), "float32", 0, 1)
    config.pop("rope_scaling")
    config["rope_parameters"] = rope
    torch.manual_seed(0)
    model = DeepseekV3ForCausalLM(
        DeepseekV3Config(**{k: v for k, v in config.items() if k != "architectures"})
    )
    with torch.no_grad():
        for name_, p in model.named_parameters():
            p.normal_(0, 0.05 if p.dim() > 1 else 0.02).add_(1.0 if "norm" in name_ else 0.0)
        for m in model.modules():
            if hasattr(m, "e_score_correction_bias"):
                m.e_score_correction_bias.normal_(0, 0.05)
    folder = str(tmp_path / name)
    model.save_pretrained(folder)
    return folder


YARN = {
    "rope_type": "yarn",
    "factor": 4.0,
    "original_max_position_embeddings": 64,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "rope_theta": 10000.0,
}


@pytest.mark.parametrize(
    "rope",
    [
        YARN,
        {k: v for k, v in YARN.items() if k != "mscale_all_dim"},
        {"rope_type": "default", "rope_theta": 10000.0},
    ],
    ids=["yarn", "yarn_without_mscale_all_dim", "no_yarn"],
)
def test_folder_written_by_transformers_computes_the_same_below_and_above_original_seq_len(
    tmp_path, rope
):
    folder = _transformers_folder(tmp_path, rope)
    for seq in (32, 128):  # below and above the folder's original_max_position_embeddings (64)
        args = model_args(
            "deepseek_v3",
            "tiny",
            Tokenizer("").vocab_size,
            seq,
            rules=initial_rules("deepseek_v3", folder),
        )
        check_folder(folder, "deepseek_v3", "tiny", args)
        model = Transformer(args)
        model.init_weights(5, torch.device("cpu"))
        hf_weights.load_hf_weights([model], folder, "deepseek_v3", args)
        tokens = _tokens(args.vocab_size, seq)
        with torch.no_grad():
            ours = model.eval()(tokens)
        theirs = _hf_logits(folder, tokens)
        _compare(
            ours,
            theirs,
            f"transformers' own folder, rope {rope.get('rope_type')}"
            f"{'' if 'mscale_all_dim' in rope else ' (no mscale_all_dim)'}, seq {seq}",
        )
        if rope["rope_type"] == "yarn" and seq == 32:
            # the reference rule (YaRN only beyond original_seq_len) would compute another model here
            ref = dataclasses.replace(args, yarn="beyond_original")
            assert softmax_scale(ref) != softmax_scale(args) or "mscale_all_dim" not in rope
            wrong = Transformer(ref)
            wrong.load_state_dict(model.state_dict())
            with torch.no_grad():
                assert (wrong.eval()(tokens) - theirs).abs().max().item() > 1e-3


def test_mscale_unlike_mscale_all_dim_is_refused_in_one_line(tmp_path):
    folder = _transformers_folder(tmp_path, {**YARN, "mscale": 0.707, "mscale_all_dim": 1.0})
    args = model_args(
        "deepseek_v3",
        "tiny",
        Tokenizer("").vocab_size,
        128,
        rules=initial_rules("deepseek_v3", folder),
    )
    with pytest.raises(HFFolderError) as e:
        check_folder(folder, "deepseek_v3", "tiny", args)
    message = str(e.value)
    print(message)
    assert "\n" not in message and "rope_scaling.mscale=0.707 != mscale_all_dim=1.0" in message
    assert message.startswith("--checkpoint.initial_load_path: ")


def test_mismatched_folder_is_one_line_naming_the_keys(tmp_path):
    args = _args(128)
    folder = _export(_model(args), args, tmp_path / "hf")
    config = json.load(open(os.path.join(folder, "config.json")))
    config.update(n_routed_experts=16, scoring_func="softmax", num_nextn_predict_layers=0)
    json.dump(config, open(os.path.join(folder, "config.json"), "w"))
    with pytest.raises(HFFolderError) as e:
        check_folder(
            folder,
            "deepseek_v3",
            "tiny",
            dataclasses.replace(args, mtp_depth=1) if hasattr(args, "mtp_depth") else args,
        )
    message = str(e.value)
    print(message)
    assert "\n" not in message and "n_routed_experts=16 (ours: 8)" in message
    assert "scoring_func='softmax' (ours: 'sigmoid')" in message


def test_fused_experts_folder_reads_the_same_weights(tmp_path):
    """transformers 5's in-memory layout: experts.gate_up_proj [E, 2I, H], experts.down_proj [E, H, I]."""
    from safetensors.torch import load_file, save_file

    args = _args(128)
    model = _model(args)
    folder = _export(model, args, tmp_path / "hf")
    file = os.path.join(folder, "model-0000.safetensors")
    tensors = load_file(file)
    for i in range(args.n_dense_layers, args.n_layers):
        p = f"model.layers.{i}.mlp.experts."

        def pop(proj: str, p: str = p) -> torch.Tensor:
            return torch.stack(
                [tensors.pop(f"{p}{e}.{proj}.weight") for e in range(args.n_routed_experts)]
            )

        gate, up, down = pop("gate_proj"), pop("up_proj"), pop("down_proj")
        tensors[p + "gate_up_proj"], tensors[p + "down_proj"] = torch.cat([gate, up], dim=1), down
    os.remove(os.path.join(folder, "model.safetensors.index.json"))
    save_file(tensors, file)
    check_folder(folder, "deepseek_v3", "tiny", args)
    fresh = _model(args, seed=9)
    hf_weights.load_hf_weights([fresh], folder, "deepseek_v3", args)
    for (name, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(a, b), name


def test_a_rank_reads_only_its_experts_and_rows(tmp_path):
    args = _args(128)
    model = _model(args)
    folder = _export(model, args, tmp_path / "hf")
    wmap = weight_map(folder, "k")
    full = hf_weights.FolderReader(wmap)
    stack = "layers.1.moe.experts.w1"
    assert torch.equal(hf_convert.read_local(stack, args, full, None), model.get_parameter(stack))
    all_bytes = full.bytes_read
    half = hf_weights.FolderReader(wmap)
    index = [
        torch.arange(4, 8),
        torch.arange(8, 24),
        None,
    ]  # experts 4..7 (EP rank 1 of 2), rows 8..23
    got = hf_convert.read_local(stack, args, half, index)
    assert torch.equal(got, model.get_parameter(stack)[4:8, 8:24])
    assert half.bytes_read * 4 == all_bytes  # half the experts, half their rows
    print(
        f"{stack}: all experts {all_bytes} bytes, experts 4..7 rows 8..23: {half.bytes_read} bytes"
    )


def _quantize(w: torch.Tensor, block=128):
    """Block-wise FP8 as the published checkpoints store it: w ~= q * scale_inv per tile."""
    rows, cols = -(-w.shape[0] // block), -(-w.shape[1] // block)
    scale = torch.empty(rows, cols)
    q = torch.empty(w.shape, dtype=torch.float8_e4m3fn)
    for i in range(rows):
        for j in range(cols):
            tile = w[i * block : (i + 1) * block, j * block : (j + 1) * block]
            s = tile.abs().max().clamp(min=1e-12) / 448.0
            scale[i, j] = s
            q[i * block : (i + 1) * block, j * block : (j + 1) * block] = (tile / s).to(
                torch.float8_e4m3fn
            )
    return q, scale


def _dequantize_by_tiles(q, scale, block=128):
    """Independent of the importer: loop over the tiles."""
    out = torch.empty(q.shape, dtype=torch.float32)
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            rs, cs = slice(i * block, (i + 1) * block), slice(j * block, (j + 1) * block)
            out[rs, cs] = q[rs, cs].to(torch.float32) * scale[i, j]
    return out


def test_fp8_block_wise_checkpoint_imports_exactly(tmp_path):
    from safetensors.torch import load_file, save_file

    # width 320 = 2 full 128-blocks + a partial one; the expert rows (96) are a partial block
    args = _args(
        64, dim=320, inter_dim=384, moe_inter_dim=96, n_heads=4, kv_lora_rank=160, q_lora_rank=192
    )
    model = _model(args)
    folder = _export(model, args, tmp_path / "fp8", dtype="bfloat16")
    file = os.path.join(folder, "model-0000.safetensors")
    tensors = load_file(file)
    expected, quantized = {}, 0
    for name in list(tensors):
        if ".layers." in name and name.endswith("proj.weight"):
            q, s = _quantize(tensors[name].float())
            tensors[name], tensors[name[: -len(".weight")] + ".weight_scale_inv"] = q, s
            expected[name] = _dequantize_by_tiles(q, s)
            quantized += 1
    save_file(tensors, file)
    os.remove(os.path.join(folder, "model.safetensors.index.json"))
    config = json.load(open(os.path.join(folder, "config.json")))
    config["quantization_config"] = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
    }
    json.dump(config, open(os.path.join(folder, "config.json"), "w"))
    check_folder(folder, "deepseek_v3", "tiny", args)

    fresh = _model(args, seed=4)
    hf_weights.load_hf_weights([fresh], folder, "deepseek_v3", args)
    ours = {
        n: t
        for name, p in hf_weights.checkpointed_tensors(fresh, hf_convert)
        for n, t in hf_convert.export_tensors(name, p.detach(), args)
    }
    for name, want in expected.items():
        assert torch.equal(ours[name], want), name  # float32 parameters: the dequantization exactly
    # a rank's rows 100..299 of a 320-wide weight: partial tiles at both ends
    reader = hf_weights.FolderReader(weight_map(folder, "k"))
    name = "model.layers.0.mlp.gate_proj.weight"
    part = reader.read(name, [torch.arange(100, 300), None])
    assert torch.equal(part, expected[name][100:300])
    tokens = _tokens(args.vocab_size, 64)
    with torch.no_grad():
        exact, fp8 = model(tokens), fresh.eval()(tokens)
    diff = (exact - fp8).abs().max().item()
    scale = exact.abs().max().item()
    print(
        f"FP8 import: {quantized} block-wise weights dequantized exactly; logits vs the unquantized model:"
        f" max |diff| {diff:.3g} (max |logit| {scale:.3g}), same argmax"
        f" {(exact.argmax(-1) == fp8.argmax(-1)).float().mean().item():.1%}"
    )
    # e4m3 keeps 3 mantissa bits: each weight within 2^-4 relative; through 4 blocks a few % of the logits' range
    assert diff < 0.05 * scale


def test_mtp_layer_of_a_folder_is_skipped_with_one_line(tmp_path):
    from safetensors.torch import save_file

    args = _args(128)
    model = _model(args)
    folder = _export(model, args, tmp_path / "hf")
    n, d = args.n_layers, args.dim
    # the published layout's MTP layer n: its own block tensors plus enorm / hnorm / eh_proj / shared head
    mtp = {
        name.replace(f"layers.{n - 1}.", f"layers.{n}."): t.clone()
        for name, t in _tensors(folder).items()
        if f"layers.{n - 1}." in name
    }
    mtp.update(
        {
            f"model.layers.{n}.enorm.weight": torch.ones(d),
            f"model.layers.{n}.hnorm.weight": torch.ones(d),
            f"model.layers.{n}.eh_proj.weight": torch.zeros(d, 2 * d),
            f"model.layers.{n}.shared_head.norm.weight": torch.ones(d),
            f"model.layers.{n}.shared_head.head.weight": torch.zeros(args.vocab_size, d),
            f"model.layers.{n}.embed_tokens.weight": torch.zeros(args.vocab_size, d),
        }
    )
    save_file(mtp, os.path.join(folder, "mtp.safetensors"))
    index = os.path.join(folder, "model.safetensors.index.json")
    data = json.load(open(index))
    data["weight_map"].update({k: "mtp.safetensors" for k in mtp})
    json.dump(data, open(index, "w"))
    config = json.load(open(os.path.join(folder, "config.json")))
    config["num_nextn_predict_layers"] = 1
    json.dump(config, open(os.path.join(folder, "config.json"), "w"))
    check_folder(folder, "deepseek_v3", "tiny", args)
    done = hf_weights.load_hf_weights([_model(args, seed=2)], folder, "deepseek_v3", args)
    print(done.note)
    assert done.note == (
        "skipping the folder's multi-token-prediction layer(s) 4 (--model.mtp_depth=0; set it to 1"
        " to train them)"
    )


def _tensors(folder):
    from safetensors.torch import load_file

    out = {}
    for f in os.listdir(folder):
        if f.endswith(".safetensors"):
            out.update(load_file(os.path.join(folder, f)))
    return out


def test_the_folder_rule_survives_conversion_to_a_checkpoint(tmp_path):
    """A yarn folder -> convert_hf.py's model-only checkpoint -> a run at seq 32 (below
    original_seq_len) started from that checkpoint still applies YaRN, as the folder's model."""
    folder = _transformers_folder(tmp_path, YARN)
    out, _ = checkpoint_hf.import_folder(folder, str(tmp_path / "step-0"), "deepseek_v3", "tiny")
    vocab = Tokenizer("").vocab_size
    from_folder = model_args(
        "deepseek_v3", "tiny", vocab, 32, rules=initial_rules("deepseek_v3", folder)
    )
    from_checkpoint = model_args(
        "deepseek_v3", "tiny", vocab, 32, rules=initial_rules("deepseek_v3", out)
    )
    assert from_folder.yarn == from_checkpoint.yarn == "always"
    assert model_args("deepseek_v3", "tiny", vocab, 32).yarn == "beyond_original"


def test_mtp_module_exports_to_layer_n_layers_and_imports_back(tmp_path):
    args = _args(128, mtp_depth=1)
    model = _model(args)
    folder = _export(model, args, tmp_path / "hf")
    n = args.n_layers
    stored = weight_map(folder, "k")
    for name in (
        "enorm.weight",
        "hnorm.weight",
        "eh_proj.weight",
        "shared_head.norm.weight",
        "self_attn.kv_b_proj.weight",
        "mlp.experts.7.down_proj.weight",
        "mlp.gate.e_score_correction_bias",
    ):
        assert f"model.layers.{n}.{name}" in stored, name
    tensors = _tensors(folder)  # the published layout's copies of the shared embedding and head
    assert torch.equal(
        tensors[f"model.layers.{n}.embed_tokens.weight"], model.tok_embeddings.weight
    )
    assert torch.equal(tensors[f"model.layers.{n}.shared_head.head.weight"], model.output.weight)
    assert torch.equal(tensors[f"model.layers.{n}.eh_proj.weight"], model.mtp["0"].eh_proj.weight)
    assert json.load(open(os.path.join(folder, "config.json")))["num_nextn_predict_layers"] == 1
    check_folder(folder, "deepseek_v3", "tiny", args)
    fresh = _model(args, seed=6)
    hf_weights.load_hf_weights([fresh], folder, "deepseek_v3", args)
    for (name, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(a, b), name
    # transformers reads the main model of the same folder (the MTP layer is not part of its forward)
    tokens = _tokens(args.vocab_size, 128)
    with torch.no_grad():
        _compare(
            model(tokens), _hf_logits(folder, tokens), "tiny DeepSeek-V3 with an MTP layer exported"
        )
    # a run without MTP skips the layer with one line
    plain = dataclasses.replace(args, mtp_depth=0)
    check_folder(folder, "deepseek_v3", "tiny", plain)
    assert (
        "skipping the folder's multi-token-prediction layer(s) 4"
        in hf_weights.load_hf_weights([_model(plain)], folder, "deepseek_v3", plain).note
    )
