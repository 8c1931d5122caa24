"""DeepSeek-V3 on CPU: flavors on meta, MLA, YaRN, router, grouped experts, MoE dispatch and
load balancing, activation-checkpoint token counting, layout-independent (per-expert) init."""

import dataclasses
import math
import zlib

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from torchtitan.models.common.attention import attention_inputs
from torchtitan.models.common.init import (
    expert_slices,
    init_expert_stack,
    init_parameters,
    trunc_normal,
)
from torchtitan.models.common.moe import (
    GroupedExperts,
    MoE,
    TokenChoiceRouter,
    moe_aux_loss,
    moe_modules,
    sequence_balance_loss,
    update_expert_bias,
)
from torchtitan.models.common.rope import apply_rope
from torchtitan.models.deepseek_v3.args import FLAVORS, DeepSeekV3Args
from torchtitan.models.deepseek_v3.model import (
    Attention,
    Transformer,
    softmax_scale,
    yarn_frequencies,
)

VOCAB, SEQ = 256, 128


def tiny_args(**overrides) -> DeepSeekV3Args:
    return dataclasses.replace(
        FLAVORS["tiny"], **{"vocab_size": VOCAB, "max_seq_len": SEQ, **overrides}
    )


def cpu_model(seed: int = 0, **overrides) -> Transformer:
    with torch.device("meta"):
        model = Transformer(tiny_args(**overrides))
    model.to_empty(device="cpu")
    model.init_weights(seed=seed, device="cpu")
    return model


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def tokens(bsz: int = 2, seq: int = 16, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (bsz, seq), generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------- args and flavors


def test_flavors_and_derived_fields():
    assert list(FLAVORS) == ["debugmodel", "debugmodel_flex_attn", "tiny", "16B", "671B"]
    for a in FLAVORS.values():
        assert (
            a.qk_head_dim == a.qk_nope_head_dim + a.qk_rope_head_dim and a.n_kv_heads == a.n_heads
        )
        assert a.n_routed_experts % a.n_expert_groups == 0
        # grouped_mm: the contraction dims' strides must be multiples of 16 bytes (bf16: 8)
        assert a.dim % 8 == 0 and a.moe_inter_dim % 8 == 0
    assert FLAVORS["tiny"].n_expert_groups > FLAVORS["tiny"].n_limited_groups  # group limit active
    with pytest.raises(dataclasses.FrozenInstanceError):
        FLAVORS["tiny"].dim = 1


@pytest.mark.parametrize(
    "flavor, published, active", [("16B", 15.7e9, 2.66e9), ("671B", 671e9, 37.6e9)]
)
def test_published_sizes_on_meta(flavor, published, active):
    with torch.device("meta"):
        model = Transformer(dataclasses.replace(FLAVORS[flavor], max_seq_len=64))
    assert abs(n_params(model) - published) / published < 0.005
    emb = model.tok_embeddings.weight.numel()
    assert abs(model.flops_per_token(0) / 6 + emb - active) / active < 0.01


def test_exact_small_flavor_sizes_and_names():
    with torch.device("meta"):
        debug = Transformer(
            dataclasses.replace(FLAVORS["debugmodel"], vocab_size=2048, max_seq_len=SEQ)
        )
        tiny = Transformer(tiny_args(vocab_size=2048))
    assert n_params(debug) == 14_653_440 and n_params(tiny) == 534_720  # as in args.py's comments
    a = tiny.args
    dense, sparse = tiny.layers["0"], tiny.layers["1"]
    assert not dense.moe_enabled and sparse.moe_enabled and not hasattr(dense, "moe")
    assert dense.feed_forward.w1.weight.shape == (a.inter_dim, a.dim)
    assert sparse.moe.router.gate.weight.shape == (a.n_routed_experts, a.dim)
    assert sparse.moe.experts.w1.shape == (a.n_routed_experts, a.moe_inter_dim, a.dim)
    assert sparse.moe.experts.w2.shape == (a.n_routed_experts, a.dim, a.moe_inter_dim)
    assert sparse.moe.shared_experts.w1.weight.shape == (
        a.moe_inter_dim * a.n_shared_experts,
        a.dim,
    )
    keys = tiny.state_dict().keys()
    assert "layers.1.moe.expert_bias" in keys  # checkpointed
    assert "layers.1.moe.tokens_per_expert" not in keys and "rope" not in keys
    assert tiny.rope.shape == (SEQ, a.qk_rope_head_dim)
    units = [(u.name, u.block, u.kind.value) for u in tiny.fsdp_units()]
    assert units[:3] == [
        ("tok_embeddings", None, "dense"),
        ("layers.0", "layers.0", "dense"),
        ("layers.1", "layers.1", "dense"),
    ]
    assert ("layers.1.moe.experts", "layers.1", "experts") in units


# --------------------------------------------------------------------------- MLA and YaRN


@pytest.mark.parametrize("q_lora_rank", [0, 16])
def test_mla_shapes(q_lora_rank):
    a = tiny_args(q_lora_rank=q_lora_rank)
    assert a.v_head_dim != a.qk_head_dim
    torch.manual_seed(0)
    attn = Attention(a)
    assert hasattr(attn, "wq") == (q_lora_rank == 0) and hasattr(attn, "wq_b") == (q_lora_rank > 0)
    assert attn.wkv_a.weight.shape == (a.kv_lora_rank + a.qk_rope_head_dim, a.dim)
    assert attn.wkv_b.weight.shape == (
        a.n_heads * (a.qk_nope_head_dim + a.v_head_dim),
        a.kv_lora_rank,
    )
    assert attn.wo.weight.shape == (a.dim, a.n_heads * a.v_head_dim)
    x = torch.randn(2, 10, a.dim)
    rope = cpu_model().rope
    y = attn(x, attention_inputs(10, rope))
    assert y.shape == x.shape and torch.isfinite(y).all()
    # reference: explicit causal softmax attention, unpadded v, per-head k_pe shared
    q = attn.wq(x) if q_lora_rank == 0 else attn.wq_b(attn.q_norm(attn.wq_a(x)))
    q = q.view(2, 10, a.n_heads, a.qk_head_dim)
    q = torch.cat(
        [q[..., : a.qk_nope_head_dim], apply_rope(q[..., a.qk_nope_head_dim :], rope)], -1
    )
    latent, k_pe = attn.wkv_a(x).split([a.kv_lora_rank, a.qk_rope_head_dim], -1)
    kv = attn.wkv_b(attn.kv_norm(latent)).view(2, 10, a.n_heads, -1)
    k_pe = apply_rope(k_pe.unsqueeze(2), rope).expand(-1, -1, a.n_heads, -1)
    k, v = torch.cat([kv[..., : a.qk_nope_head_dim], k_pe], -1), kv[..., a.qk_nope_head_dim :]
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * softmax_scale(a)
    scores = scores.masked_fill(torch.ones(10, 10, dtype=torch.bool).triu(1), float("-inf"))
    ref = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(2, 10, -1)
    torch.testing.assert_close(y, attn.wo(ref), rtol=1e-5, atol=1e-6)


def test_mla_reads_heads_from_shapes():
    # a TP rank holds a slice of heads: wq / wkv_b rows, wo columns; the row-split wo makes
    # the full output the sum of the two halves' outputs
    a = tiny_args()
    torch.manual_seed(1)
    full = Attention(a)
    x, rope = torch.randn(1, 12, a.dim), cpu_model().rope
    halves = []
    h = a.n_heads // 2
    for r in range(2):
        part = Attention(a)
        part.load_state_dict(full.state_dict())
        for name, per_head in (("wq", a.qk_head_dim), ("wkv_b", a.qk_nope_head_dim + a.v_head_dim)):
            lin = getattr(part, name)
            lin.weight = torch.nn.Parameter(lin.weight[r * h * per_head : (r + 1) * h * per_head])
        part.wo.weight = torch.nn.Parameter(
            part.wo.weight[:, r * h * a.v_head_dim : (r + 1) * h * a.v_head_dim]
        )
        halves.append(part(x, attention_inputs(12, rope)))
    torch.testing.assert_close(
        halves[0] + halves[1], full(x, attention_inputs(12, rope)), rtol=1e-5, atol=1e-6
    )


def test_yarn_scale_and_frequencies():
    short = tiny_args(max_seq_len=64)  # == original_seq_len: no YaRN
    long = tiny_args(max_seq_len=256)
    base = short.qk_head_dim**-0.5
    assert softmax_scale(short) == base
    m = 0.1 * long.mscale * math.log(long.rope_factor) + 1
    assert softmax_scale(long) == pytest.approx(base * m * m) and softmax_scale(long) > base
    plain, yarn = yarn_frequencies(short), yarn_frequencies(long)
    assert yarn[0] == plain[0]  # the fastest frequency is kept
    assert yarn[-1] == pytest.approx(plain[-1] / long.rope_factor)  # the slowest stretched
    assert (yarn <= plain).all() and (yarn >= plain / long.rope_factor - 1e-15).all()
    assert (yarn[1:] < yarn[:-1]).all()
    big = dataclasses.replace(FLAVORS["671B"], max_seq_len=16384)
    f, p = yarn_frequencies(big), yarn_frequencies(dataclasses.replace(big, max_seq_len=4096))
    assert torch.equal(f[:10], p[:10]) and torch.allclose(f[-8:], p[-8:] / 40)


def test_causal_and_prefix_independent():
    model = cpu_model().eval()
    t = tokens(2, 24, seed=3)
    changed = t.clone()
    changed[:, 15] = (changed[:, 15] + 1) % VOCAB
    with torch.no_grad():
        a, b, prefix = model(t), model(changed), model(t[:, :15])
    torch.testing.assert_close(a[:, :15], b[:, :15], rtol=0, atol=1e-6)
    torch.testing.assert_close(a[:, :15], prefix, rtol=0, atol=1e-5)
    assert (a[:, 15] - b[:, 15]).abs().max() > 1e-4


# --------------------------------------------------------------------------- router


def make_router(**kw) -> TokenChoiceRouter:
    args = dict(
        dim=4,
        n_experts=8,
        top_k=2,
        n_groups=1,
        n_limited_groups=1,
        score_func="sigmoid",
        route_norm=False,
        route_scale=1.0,
    )
    args.update(kw)
    return TokenChoiceRouter(**args)


def test_router_top_k_norm_scale_and_float32_scores():
    scores = torch.tensor(
        [[0.1, 0.9, 0.3, 0.8, 0.2, 0.0, 0.5, 0.4], [0.7, 0.1, 0.2, 0.3, 0.95, 0.6, 0.0, 0.1]]
    )
    w, idx = make_router(top_k=3, route_scale=2.0).select(scores)
    assert idx.tolist() == [[1, 3, 6], [4, 0, 5]] and idx.dtype == torch.int64
    torch.testing.assert_close(w, scores.gather(1, idx) * 2.0)
    w, _ = make_router(route_norm=True, route_scale=2.5).select(scores[:1])
    torch.testing.assert_close(w, torch.tensor([[0.9, 0.8]]) / 1.7 * 2.5)
    r = make_router(score_func="softmax").to(torch.bfloat16)
    w, idx, scores = r(torch.randn(5, 4, dtype=torch.bfloat16))
    assert scores.dtype == w.dtype == torch.float32
    torch.testing.assert_close(scores.sum(-1), torch.ones(5))


def test_router_group_limit():
    # sigmoid (V3) ranks a group by its top-2 sum: group 0 (experts 0-3) holds the single
    # best score, group 1 (4-7) the best pair
    scores = torch.tensor([[0.99, 0.1, 0.1, 0.1, 0.8, 0.7, 0.05, 0.0]])
    assert make_router(n_groups=2, n_limited_groups=1).select(scores)[1].tolist() == [[4, 5]]
    assert make_router(n_groups=2, n_limited_groups=2).select(scores)[1].tolist() == [[0, 4]]
    assert make_router(n_groups=1).select(scores)[1].tolist() == [[0, 4]]
    # softmax ranks a group by its max: 0.4 beats 0.3 although the top-2 sums are 0.4 < 0.5
    scores = torch.tensor([[0.4, 0.0, 0.0, 0.0, 0.3, 0.2, 0.1, 0.1]])
    _, idx = make_router(score_func="softmax", n_groups=2, n_limited_groups=1).select(scores)
    assert idx[0, 0] == 0 and set(idx[0].tolist()) <= {0, 1, 2, 3}
    _, idx = make_router(score_func="sigmoid", n_groups=2, n_limited_groups=1).select(scores)
    assert set(idx[0].tolist()) == {4, 5}


def test_router_bias_changes_selection_not_weights():
    scores = torch.tensor([[0.9, 0.8, 0.1, 0.2, 0.0, 0.0, 0.0, 0.0]])
    bias = torch.zeros(8)
    bias[2] = 1.0  # expert 2 is underused: pushed into the top-2
    w, idx = make_router().select(scores, bias)
    assert idx.tolist() == [[2, 0]]
    torch.testing.assert_close(w, torch.tensor([[0.1, 0.9]]))
    # the bias also decides which groups survive
    w, idx = make_router(n_groups=2, n_limited_groups=1).select(
        scores, torch.tensor([0.0] * 4 + [2.0] * 4)
    )
    assert set(idx[0].tolist()) <= {4, 5, 6, 7}
    assert (w == 0).all()


# --------------------------------------------------------------------------- load balancing


def test_bias_update_direction_and_reset():
    moe = MoE(8, 4, n_experts=4, top_k=1)
    moe.tokens_per_expert.fill_(5.0)
    update_expert_bias(moe, torch.tensor([10, 2, 6, 6]), coeff=0.01)  # mean 6
    torch.testing.assert_close(moe.expert_bias, torch.tensor([-0.01, 0.01, 0.0, 0.0]))
    assert (moe.tokens_per_expert == 0).all()
    assert not moe.expert_bias.requires_grad


def test_sequence_balance_loss():
    # uniform affinities: sum_i f_i P_i = sum_i f_i / E = 1 whatever the choices
    scores = torch.full((2, 3, 4), 0.5)
    idx = torch.randint(0, 4, (2, 3, 2), generator=torch.Generator().manual_seed(0))
    assert sequence_balance_loss(scores, idx, 0.1).item() == pytest.approx(0.1)
    # one sequence of 2 tokens, top-1: both pick expert 0 whose normalised affinity is 0.75
    scores = torch.tensor([[[3.0, 1.0], [3.0, 1.0]]])
    idx = torch.tensor([[[0], [0]]])
    # f = [2 * 2 / (1 * 2), 0] = [2, 0]; P = [0.75, 0.25] -> 1.5
    assert sequence_balance_loss(scores, idx, 1.0).item() == pytest.approx(1.5)


def test_aux_loss_reaches_the_router():
    model = cpu_model(aux_loss_coeff=0.01)
    assert moe_aux_loss(cpu_model()) is None  # off by default
    model(tokens())
    aux = moe_aux_loss(model)
    assert aux is not None and aux.ndim == 0 and aux.item() > 0
    assert len([m for m in moe_modules(model) if m.aux_loss is not None]) == 3
    aux.backward()
    assert model.layers["1"].moe.router.gate.weight.grad.abs().sum() > 0


# --------------------------------------------------------------------------- grouped experts and MoE


def test_grouped_experts_match_a_per_expert_loop():
    torch.manual_seed(0)
    ge = GroupedExperts(8, 12, 4)
    counts = torch.tensor([3, 0, 5, 2])  # expert 1 gets no rows
    x = torch.randn(10, 8, requires_grad=True)
    y = ge(x, counts)
    g = torch.randn_like(y)  # contiguous upstream grad: grouped_mm's backward rejects stride 0
    (y * g).sum().backward()
    got = [x.grad.clone()] + [w.grad.clone() for w in (ge.w1, ge.w2, ge.w3)]

    x.grad = None
    ge.zero_grad()
    outs, start = [], 0
    for e, n in enumerate(counts.tolist()):
        xe = x[start : start + n]
        outs.append((F.silu(xe @ ge.w1[e].T) * (xe @ ge.w3[e].T)) @ ge.w2[e].T)
        start += n
    ref = torch.cat(outs)
    (ref * g).sum().backward()
    torch.testing.assert_close(y, ref, rtol=1e-6, atol=1e-6)
    for a, b in zip(got, [x.grad] + [w.grad for w in (ge.w1, ge.w2, ge.w3)]):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    assert (got[1][1] == 0).all()  # the empty expert gets a zero gradient


def test_moe_matches_a_per_token_reference():
    torch.manual_seed(0)
    moe = MoE(
        8,
        4,
        n_experts=6,
        top_k=2,
        n_shared_experts=1,
        n_groups=3,
        n_limited_groups=2,
        score_func="softmax",
        route_norm=True,
        route_scale=1.5,
    )
    with torch.no_grad():
        moe.expert_bias.copy_(torch.randn(6) * 0.1)
    x = torch.randn(2, 5, 8)
    y = moe(x)
    flat = x.view(-1, 8)
    w, idx, _ = moe.router(flat, moe.expert_bias)
    ref = moe.shared_experts(flat)
    ge = moe.experts
    for t in range(flat.shape[0]):
        for j in range(2):
            e, xt = idx[t, j], flat[t]
            ref[t] += w[t, j] * ((F.silu(ge.w1[e] @ xt) * (ge.w3[e] @ xt)) @ ge.w2[e].T)
    torch.testing.assert_close(y, ref.view(2, 5, 8), rtol=1e-5, atol=1e-6)
    counts = torch.bincount(idx.flatten(), minlength=6)
    torch.testing.assert_close(moe.tokens_per_expert, counts)


def _sac_context():
    def policy(ctx, op, *args, **kwargs):
        return (
            CheckpointPolicy.MUST_SAVE
            if op == torch.ops.aten.mm.default
            else CheckpointPolicy.PREFER_RECOMPUTE
        )

    return create_selective_checkpoint_contexts(policy)


@pytest.mark.parametrize("ac", ["none", "full", "selective"])
def test_tokens_counted_once_under_activation_checkpointing(ac):
    torch.manual_seed(0)
    moe = MoE(8, 4, n_experts=4, top_k=2, n_shared_experts=1)
    x = torch.randn(2, 6, 8, requires_grad=True)
    if ac == "none":
        y = moe(x)
    else:
        kw = {"context_fn": _sac_context} if ac == "selective" else {}
        y = checkpoint(moe, x, use_reentrant=False, **kw)
    assert moe.tokens_per_expert.sum().item() == 2 * 6 * 2
    (y * torch.randn_like(y)).sum().backward()  # recomputes the forward (ac != none)
    assert moe.tokens_per_expert.sum().item() == 2 * 6 * 2
    assert moe.router.gate.weight.grad is not None
    moe.eval()
    with torch.no_grad():
        moe(x)  # evaluation does not steer the balancing
    assert moe.tokens_per_expert.sum().item() == 2 * 6 * 2


def test_gradients_equal_with_and_without_checkpointing():
    model = cpu_model(aux_loss_coeff=0.01)
    t = tokens()
    grads = []
    for ac in (False, True):
        model.zero_grad()
        h = model.tok_embeddings(t)
        attn = attention_inputs(t.shape[1], model.rope)
        for layer in model.layers.values():
            h = checkpoint(layer, h, attn, use_reentrant=False) if ac else layer(h, attn)
        loss = model.output(model.norm(h)).logsumexp(-1).mean() + moe_aux_loss(model)
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for n in grads[0]:
        torch.testing.assert_close(grads[0][n], grads[1][n], rtol=1e-5, atol=1e-7, msg=n)


# --------------------------------------------------------------------------- whole model


def test_forward_backward_tiny():
    model = cpu_model()
    out = model(tokens(2, 32))
    assert out.shape == (2, 32, VOCAB) and torch.isfinite(out).all()
    F.cross_entropy(out.flatten(0, 1), tokens(2, 32, seed=1).flatten()).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    per_layer = [m.tokens_per_expert.sum().item() for m in moe_modules(model)]
    assert per_layer == [2 * 32 * model.args.n_activated_experts] * 3


def test_pipeline_stage_passes_hidden_states_through():
    full = cpu_model().eval()
    first = cpu_model(n_layers=2).eval()
    first.norm, first.output = None, None
    last = cpu_model().eval()
    last.tok_embeddings = None
    del last.layers["0"], last.layers["1"]
    t = tokens(2, 12)
    with torch.no_grad():
        torch.testing.assert_close(last(first(t)), full(t), rtol=0, atol=1e-5)


# --------------------------------------------------------------------------- init


def test_init_deterministic_layout_independent_and_buffers_zeroed():
    a, b = cpu_model(seed=3).state_dict(), cpu_model(seed=3, n_layers=2).state_dict()
    assert set(b) < set(a)
    for k, v in b.items():
        assert torch.equal(v, a[k]), k
    model = cpu_model(seed=3)
    for m in moe_modules(model):
        assert (m.expert_bias == 0).all() and (m.tokens_per_expert == 0).all()
    w2 = model.layers["3"].moe.experts.w2
    assert w2.abs().max() <= 3 * 0.02 / math.sqrt(8) + 1e-7  # depth-scaled like wo
    assert not torch.equal(w2[0], w2[1])


def test_expert_stack_is_the_concatenation_of_per_expert_draws():
    fn = trunc_normal(0.02)
    full = expert_slices("layers.1.moe.experts.w1", fn, 7, "cpu", (6, 4, 8), experts=range(6))
    part = expert_slices("layers.1.moe.experts.w1", fn, 7, "cpu", (6, 4, 8), experts=[2, 3, 4])
    assert torch.equal(full[2:5], part)
    model = cpu_model(seed=7)
    w1 = model.layers["1"].moe.experts.w1
    shape = tuple(w1.shape)
    assert torch.equal(
        w1, expert_slices("layers.1.moe.experts.w1", fn, 7, "cpu", shape, experts=range(shape[0]))
    )


def test_llama3_style_init_is_unchanged():
    # without per_expert, every parameter is still drawn whole from seed + crc32(name)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 2))
    init_parameters(model, lambda fqn: trunc_normal(0.02), 5, "cpu")
    for name, p in model.named_parameters():
        gen = torch.Generator().manual_seed((5 * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
        ref = torch.empty(p.shape)
        torch.nn.init.trunc_normal_(ref, 0.0, 0.02, -0.06, 0.06, generator=gen)
        assert torch.equal(p, ref), name


def test_sharded_expert_init_draws_only_local_experts(monkeypatch):
    # one process plays every rank of a fake process group (collectives do nothing)
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor
    from torch.distributed.tensor.placement_types import _StridedShard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import torchtitan.models.common.init as init_mod

    name, shape, fn = "layers.1.moe.experts.w2", (8, 4, 8), trunc_normal(0.01)
    full = expert_slices(name, fn, 11, "cpu", shape, experts=range(shape[0]))
    drawn, real_generator = [], init_mod._generator
    monkeypatch.setattr(
        init_mod, "_generator", lambda nm, *a: drawn.append(nm) or real_generator(nm, *a)
    )
    layouts = [  # (mesh, placements, experts per rank): EP; FSDP over EP on dim 0; EP + TP on dim 1
        ((4,), [Shard(0)], 2),
        ((2, 2), [_StridedShard(0, split_factor=2), Shard(0)], 2),
        ((2, 2), [Shard(0), Shard(1)], 4),
    ]
    assert not dist.is_initialized()
    try:
        for n, (mesh_shape, placements, per_rank) in enumerate(layouts):
            for rank in range(4):
                dist.init_process_group("fake", rank=rank, world_size=4, store=FakeStore())
                # fresh dim names: DTensor.from_local would otherwise reuse an equal mesh
                # object made under the previous fake rank, with that rank's coordinate
                names = tuple(f"l{n}r{rank}d{i}" for i in range(len(mesh_shape)))
                mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
                expected = distribute_tensor(full, mesh, placements, src_data_rank=None).to_local()
                param = torch.nn.Parameter(
                    DTensor.from_local(
                        torch.full(expected.shape, float("nan")),
                        mesh,
                        placements,
                        run_check=False,
                        shape=torch.Size(shape),
                        stride=full.stride(),
                    )
                )
                drawn.clear()
                init_expert_stack(param, name, fn, 11, "cpu")
                assert torch.equal(param.to_local(), expected), (placements, rank)
                assert len(drawn) == per_rank, drawn  # only the local experts are drawn
                if n == 0:
                    assert drawn == [f"{name}[{e}]" for e in (2 * rank, 2 * rank + 1)]
                dist.destroy_process_group()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
