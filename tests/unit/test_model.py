"""Llama3 shapes on the meta device, CPU forward of the small flavors, init, causality, RoPE."""

import dataclasses
import math

import pytest
import torch

from torchtitan.models.common.init import clean_fqn
from torchtitan.models.common.rope import apply_rope, rope_cache, rope_frequencies
from torchtitan.models.flavors import flavors_of, model_args
from torchtitan.models.llama3.args import FLAVORS, Llama3Args
from torchtitan.models.llama3.model import Transformer
from torchtitan.models.registry import MODELS
from torchtitan.models.train_spec import get_train_spec

VOCAB, SEQ = 2048, 128


def meta_model(flavor: str, vocab_size: int = VOCAB, seq_len: int = SEQ) -> Transformer:
    args = model_args("llama3", flavor, vocab_size=vocab_size, seq_len=seq_len)
    with torch.device("meta"):
        return Transformer(args)


def cpu_model(flavor: str, seed: int = 0, **overrides) -> Transformer:
    args = dataclasses.replace(
        model_args("llama3", flavor, vocab_size=VOCAB, seq_len=SEQ), **overrides
    )
    with torch.device("meta"):
        model = Transformer(args)
    model.to_empty(device="cpu")
    model.init_weights(seed=seed, device="cpu")
    return model


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def expected_params(a: Llama3Args) -> int:
    """Closed-form count: embeddings + output + per-layer attention, SwiGLU and two norms + final norm."""
    attn = a.dim * a.n_heads * a.head_dim * 2 + a.dim * a.n_kv_heads * a.head_dim * 2
    ffn = 3 * a.dim * a.ffn_hidden_dim
    return 2 * a.vocab_size * a.dim + a.n_layers * (attn + ffn + 2 * a.dim) + a.dim


# --------------------------------------------------------------------------- shapes on meta


def test_flavor_registry():
    assert list(FLAVORS) == [
        "debugmodel",
        "debugmodel_flex_attn",
        "debugmodel_varlen_attn",
        "tiny",
        "1B",
        "3B",
        "8B",
        "8B_flex",
        "8B_varlen",
        "70B",
        "405B",
    ]
    assert flavors_of("llama3") is FLAVORS
    spec = get_train_spec("llama3")
    assert spec.name == "llama3" and spec.model_cls is Transformer and spec.flavors is FLAVORS
    assert callable(spec.parallelize_fn)


def test_unknown_train_spec():
    with pytest.raises(ValueError) as info:
        get_train_spec("gpt2")
    assert (
        str(info.value)
        == f"--model.name: no train spec for 'gpt2'; registered: {', '.join(MODELS)}"
    )


@pytest.mark.parametrize("flavor", list(FLAVORS))
def test_every_flavor_builds_on_meta_with_the_closed_form_count(flavor):
    model = meta_model(flavor)
    a = model.args
    assert all(p.is_meta for p in model.parameters())
    assert n_params(model) == expected_params(a)
    assert list(model.layers.keys()) == [str(i) for i in range(a.n_layers)]
    assert model.tok_embeddings.weight.shape == (a.vocab_size, a.dim)
    assert model.output.weight.shape == (a.vocab_size, a.dim)
    block = model.layers["0"]
    assert block.attention.wq.weight.shape == (a.n_heads * a.head_dim, a.dim)
    assert block.attention.wk.weight.shape == (a.n_kv_heads * a.head_dim, a.dim)
    assert block.attention.wv.weight.shape == (a.n_kv_heads * a.head_dim, a.dim)
    assert block.attention.wo.weight.shape == (a.dim, a.n_heads * a.head_dim)
    assert block.feed_forward.w1.weight.shape == (a.ffn_hidden_dim, a.dim)
    assert block.feed_forward.w2.weight.shape == (a.dim, a.ffn_hidden_dim)
    assert block.feed_forward.w3.weight.shape == (a.ffn_hidden_dim, a.dim)
    assert model.rope.shape == (SEQ, a.head_dim)
    assert "rope" not in model.state_dict()  # the cache is rebuilt, never checkpointed


@pytest.mark.parametrize(
    "flavor, published, ffn_hidden",
    [("8B", 8.03e9, 14336), ("70B", 70.6e9, 28672), ("405B", 405.8e9, 53248)],
)
def test_published_sizes(flavor, published, ffn_hidden):
    model = meta_model(flavor)
    a = model.args
    assert a.vocab_size == 128256  # the flavor's own vocabulary, not the 2K tokenizer's
    assert a.head_dim == 128
    assert a.n_kv_heads == 8
    assert a.ffn_hidden_dim == ffn_hidden
    count = n_params(model)
    assert abs(count - published) / published < 0.01, count


def test_exact_small_flavor_sizes():
    # pinned so that an accidental shape change shows up; matches the comments in args.py
    assert n_params(meta_model("debugmodel")) == 5_770_496
    assert n_params(meta_model("tiny")) == 459_328
    assert FLAVORS["debugmodel"].ffn_hidden_dim == 768
    assert FLAVORS["tiny"].ffn_hidden_dim == 192
    assert FLAVORS["debugmodel"].head_dim == 16
    assert FLAVORS["tiny"].head_dim == 8


def test_ffn_hidden_dim_rounding():
    # 2/3 * 4 * dim, times the multiplier, rounded UP to a multiple of multiple_of
    assert (
        Llama3Args(dim=96, multiple_of=32, ffn_dim_multiplier=None).ffn_hidden_dim == 256
    )  # 256 exactly
    assert (
        Llama3Args(dim=100, multiple_of=32, ffn_dim_multiplier=None).ffn_hidden_dim == 288
    )  # 266 -> 288
    assert (
        Llama3Args(dim=100, multiple_of=1, ffn_dim_multiplier=1.5).ffn_hidden_dim == 399
    )  # int(1.5*266)


def test_model_args_fills_vocab_and_seq_len():
    a = model_args("llama3", "debugmodel", vocab_size=1234, seq_len=77)
    assert a.vocab_size == 1234 and a.max_seq_len == 77
    assert FLAVORS["debugmodel"].vocab_size == 0  # the registry entry is not modified
    b = model_args("llama3", "8B", vocab_size=128256, seq_len=8192)
    assert b.vocab_size == 128256 and b.max_seq_len == 8192


def test_model_args_rejects_a_larger_tokenizer():
    with pytest.raises(ValueError) as info:
        model_args("llama3", "8B", vocab_size=128257, seq_len=128)
    assert str(info.value) == (
        "--model.tokenizer_path: tokenizer has 128257 tokens but llama3 8B has only 128256 embeddings;"
        " use a matching tokenizer"
    )


# --------------------------------------------------------------------------- CPU forward and init


@pytest.fixture(scope="module")
def debug_model():
    return cpu_model("debugmodel", seed=0).eval()


@pytest.mark.parametrize("flavor", ["tiny", "debugmodel"])
def test_forward_logits_shape(flavor, debug_model):
    model = debug_model if flavor == "debugmodel" else cpu_model(flavor).eval()
    tokens = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(tokens)
    assert logits.shape == (2, 24, VOCAB)
    assert logits.dtype == torch.float32
    assert torch.isfinite(logits).all()


def test_rope_buffer_is_rebuilt_by_init_weights(debug_model):
    a = debug_model.args
    assert torch.equal(
        debug_model.rope, rope_cache(a.max_seq_len, a.head_dim, a.rope_theta, a.rope_scaling)
    )


def test_init_is_deterministic_per_seed():
    a = cpu_model("tiny", seed=0).state_dict()
    b = cpu_model("tiny", seed=0).state_dict()
    c = cpu_model("tiny", seed=1).state_dict()
    assert a.keys() == b.keys() == c.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
        if not k.endswith("norm.weight"):
            assert not torch.equal(a[k], c[k]), k


def test_init_is_layout_independent():
    # every parameter comes from its own generator: a model with fewer layers (a pipeline stage)
    # holds bitwise the same values for the parameters it shares with the full model
    full = cpu_model("tiny", seed=3).state_dict()
    part = cpu_model("tiny", seed=3, n_layers=2).state_dict()
    assert set(part) < set(full)
    for k, v in part.items():
        assert torch.equal(v, full[k]), k


def test_init_distributions(debug_model):
    a = debug_model.args
    p = dict(debug_model.named_parameters())
    for name, t in p.items():
        if name.endswith("norm.weight"):
            assert torch.equal(t, torch.ones_like(t)), name
    emb = p["tok_embeddings.weight"]
    assert emb.std().item() == pytest.approx(1.0, rel=0.02)
    out_std = a.dim**-0.5
    assert p["output.weight"].abs().max().item() <= 3 * out_std + 1e-7
    assert p["output.weight"].std().item() == pytest.approx(out_std * 0.9866, rel=0.03)
    for layer in (0, 5):
        depth_std = 0.02 / math.sqrt(2 * (layer + 1))
        for key in ("attention.wo", "feed_forward.w2", "feed_forward.w3"):
            w = p[f"layers.{layer}.{key}.weight"]
            assert w.abs().max().item() <= 3 * depth_std + 1e-7
            assert w.std().item() == pytest.approx(depth_std * 0.9866, rel=0.03), key
        for key in ("attention.wq", "attention.wk", "attention.wv", "feed_forward.w1"):
            w = p[f"layers.{layer}.{key}.weight"]
            assert w.abs().max().item() <= 0.06 + 1e-7
            assert w.std().item() == pytest.approx(0.02 * 0.9866, rel=0.03), key


def test_clean_fqn():
    assert clean_fqn("layers.0._checkpoint_wrapped_module._orig_mod.attention.wq.weight") == (
        "layers.0.attention.wq.weight"
    )
    assert clean_fqn("_fsdp_wrapped_module.output.weight") == "output.weight"
    assert clean_fqn("norm.weight") == "norm.weight"


def test_init_ignores_wrapper_segments_in_names():
    # a compiled / checkpoint-wrapped block gets the same values as the plain one
    plain = dict(cpu_model("tiny", seed=5).named_parameters())
    args = model_args("llama3", "tiny", vocab_size=VOCAB, seq_len=SEQ)
    with torch.device("meta"):
        wrapped = Transformer(args)
        holder = torch.nn.Module()
        holder._checkpoint_wrapped_module = torch.nn.Module()
        holder._checkpoint_wrapped_module._orig_mod = wrapped.layers["1"]
        wrapped.layers["1"] = holder
    wrapped.to_empty(device="cpu")
    wrapped.init_weights(seed=5, device="cpu")
    params = dict(wrapped.named_parameters())
    name = "layers.1._checkpoint_wrapped_module._orig_mod.attention.wo.weight"
    assert name in params
    assert torch.equal(params[name], plain["layers.1.attention.wo.weight"])
    assert torch.equal(
        params["layers.0.attention.wo.weight"], plain["layers.0.attention.wo.weight"]
    )


def test_causal_later_tokens_do_not_change_earlier_logits(debug_model):
    gen = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, VOCAB, (2, 32), generator=gen)
    changed = tokens.clone()
    changed[:, 20] = (changed[:, 20] + 1) % VOCAB
    with torch.no_grad():
        a, b = debug_model(tokens), debug_model(changed)
    torch.testing.assert_close(a[:, :20], b[:, :20], rtol=0, atol=1e-6)
    assert (a[:, 20:] - b[:, 20:]).abs().amax(
        dim=-1
    ).min().item() > 1e-4  # every later position moves


def test_prefix_logits_do_not_depend_on_sequence_length(debug_model):
    tokens = torch.randint(0, VOCAB, (1, 40), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        full, prefix = debug_model(tokens), debug_model(tokens[:, :17])
    torch.testing.assert_close(full[:, :17], prefix, rtol=0, atol=1e-5)


def test_batch_rows_are_independent(debug_model):
    tokens = torch.randint(0, VOCAB, (3, 16), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        batched = debug_model(tokens)
        single = debug_model(tokens[1:2])
    torch.testing.assert_close(batched[1:2], single, rtol=0, atol=1e-5)


def test_pipeline_stage_passes_hidden_states_through():
    # a stage without embeddings takes hidden states; one without norm/output returns them
    full = cpu_model("tiny", seed=0).eval()
    tokens = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(10))
    first = cpu_model("tiny", seed=0, n_layers=2).eval()
    first.norm, first.output = None, None
    last = cpu_model("tiny", seed=0).eval()
    last.tok_embeddings = None
    del last.layers["0"], last.layers["1"]
    assert list(last.layers.keys()) == ["2", "3"]
    last.to_empty(device="cpu")
    last.init_weights(seed=0, device="cpu")
    with torch.no_grad():
        hidden = first(tokens)
        assert hidden.shape == (2, 12, full.args.dim)
        torch.testing.assert_close(last(hidden), full(tokens), rtol=0, atol=1e-5)


# --------------------------------------------------------------------------- RoPE


def test_rope_frequencies_without_scaling():
    f = rope_frequencies(16, 10000.0, scaling=False)
    assert f.dtype == torch.float64 and f.shape == (8,)
    expected = torch.tensor([10000.0 ** (-2 * i / 16) for i in range(8)], dtype=torch.float64)
    torch.testing.assert_close(f, expected, rtol=1e-12, atol=0)


def test_rope_scaling_keeps_high_and_divides_low_frequencies():
    plain = rope_frequencies(128, 500000.0, scaling=False)
    scaled = rope_frequencies(128, 500000.0, scaling=True)
    wavelen = 2 * math.pi / plain
    high = wavelen < 8192 / 4  # short wavelengths: untouched
    low = wavelen > 8192 / 1  # long wavelengths: slowed down by 8
    mid = ~high & ~low
    assert high[0] and low[-1] and mid.any()
    assert torch.equal(scaled[high], plain[high])
    assert torch.equal(scaled[low], plain[low] / 8)
    assert scaled[0] == plain[0] == 1.0
    assert scaled[-1] == plain[-1] / 8
    # the blend lies between the two and keeps the frequencies strictly decreasing
    assert (scaled[mid] < plain[mid]).all() and (scaled[mid] > plain[mid] / 8).all()
    assert (scaled[1:] < scaled[:-1]).all()


def test_rope_cache_layout():
    cache = rope_cache(10, 8, 10000.0, scaling=False)
    assert cache.shape == (10, 8) and cache.dtype == torch.float32
    freqs = rope_frequencies(8, 10000.0, scaling=False)
    angles = torch.outer(torch.arange(10, dtype=torch.float64), freqs)
    torch.testing.assert_close(cache[:, :4], angles.cos().float(), rtol=0, atol=1e-7)
    torch.testing.assert_close(cache[:, 4:], angles.sin().float(), rtol=0, atol=1e-7)


def test_apply_rope_preserves_pair_norms_and_position_zero():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 50, 3, 16, generator=gen)
    cache = rope_cache(64, 16, 500000.0, scaling=True)
    y = apply_rope(x, cache)
    assert y.shape == x.shape and y.dtype == x.dtype
    torch.testing.assert_close(
        y.unflatten(-1, (8, 2)).norm(dim=-1),
        x.unflatten(-1, (8, 2)).norm(dim=-1),
        rtol=1e-5,
        atol=1e-6,
    )
    assert torch.equal(y[:, 0], x[:, 0])  # angle 0: identity
    assert not torch.allclose(y[:, 1:], x[:, 1:])


def test_apply_rope_rotates_adjacent_pairs():
    # one pair (x0, x1) = (1, 0) at position p comes out as (cos, sin) of angle p * freq
    x = torch.zeros(1, 5, 1, 4)
    x[..., 0] = 1.0
    x[..., 3] = 1.0  # second pair (0, 1) -> (-sin, cos)
    cache = rope_cache(5, 4, 100.0, scaling=False)
    y = apply_rope(x, cache)[0, :, 0]
    freqs = rope_frequencies(4, 100.0, scaling=False)
    pos = torch.arange(5, dtype=torch.float64)
    torch.testing.assert_close(y[:, 0], (pos * freqs[0]).cos().float(), rtol=0, atol=1e-6)
    torch.testing.assert_close(y[:, 1], (pos * freqs[0]).sin().float(), rtol=0, atol=1e-6)
    torch.testing.assert_close(y[:, 2], -(pos * freqs[1]).sin().float(), rtol=0, atol=1e-6)
    torch.testing.assert_close(y[:, 3], (pos * freqs[1]).cos().float(), rtol=0, atol=1e-6)


def test_apply_rope_scores_depend_only_on_relative_position():
    gen = torch.Generator().manual_seed(1)
    d = 32
    q, k = torch.randn(d, generator=gen), torch.randn(d, generator=gen)
    seq = 40
    cache = rope_cache(seq, d, 500000.0, scaling=True)
    qr = apply_rope(q.expand(1, seq, 1, d).contiguous(), cache)[0, :, 0]
    kr = apply_rope(k.expand(1, seq, 1, d).contiguous(), cache)[0, :, 0]
    scores = qr @ kr.T  # scores[m, n] = <rot_m q, rot_n k>
    for offset in (0, 3, 17):
        torch.testing.assert_close(scores[offset, 0], scores[offset + 20, 20], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(scores[0, offset], scores[20, offset + 20], rtol=1e-4, atol=1e-4)


def test_apply_rope_keeps_bfloat16():
    x = torch.randn(1, 4, 2, 8).to(torch.bfloat16)
    y = apply_rope(x, rope_cache(4, 8, 10000.0, scaling=False))
    assert y.dtype == torch.bfloat16
