"""Attention inputs shared by the models: document ids from BOS tokens, the block-causal mask
(equal to causal on one document, no leakage across documents) and context parallel's
chunking and per-chunk attention (torchtitan/distributed/context_parallel.py), checked against
whole-sequence SDPA without a process group."""

import contextlib
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from torchtitan.distributed import context_parallel
from torchtitan.distributed.context_parallel import ContextParallel, causal_chunk_mask
from torchtitan.models.common.attention import (
    AttentionInputs,
    attend,
    attention_inputs,
    document_ids,
)
from torchtitan.models.flavors import model_args
from torchtitan.models.train_spec import get_train_spec

VOCAB, SEQ, BOS = 256, 32, 0
# deepseek_v3_dense: the tiny flavor with every layer dense (MLA without the MoE layers);
# qwen3 (QK-norm, tied embeddings) and qwen3_moe (its tiny_moe flavor)
MODELS = ("llama3", "deepseek_v3", "deepseek_v3_dense", "qwen3", "qwen3_moe")
MOE = ("deepseek_v3", "qwen3_moe")


def tiny_model(name: str, seed: int = 0):
    spec_name = name.removesuffix("_dense").removesuffix("_moe")
    flavor = "tiny_moe" if name == "qwen3_moe" else "tiny"
    args = model_args(spec_name, flavor, vocab_size=VOCAB, seq_len=SEQ)
    if name.endswith("_dense"):
        args = dataclasses.replace(args, n_dense_layers=args.n_layers)
    with torch.device("meta"):
        model = get_train_spec(spec_name).model_cls(args)
    model.to_empty(device="cpu")
    model.init_weights(seed, torch.device("cpu"))
    return model.eval()


@pytest.fixture(scope="module", params=MODELS)
def model(request):
    model = tiny_model(request.param)
    model.name = request.param
    return model


def ordinary_tokens(bsz: int, seq: int, seed: int) -> torch.Tensor:
    """Random tokens that are never BOS."""
    return torch.randint(1, VOCAB, (bsz, seq), generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------- document ids


def test_document_ids_count_bos_tokens():
    b = BOS
    inputs = torch.tensor(
        [
            [5, 6, b, 7, 8, b, 9, 3],  # BOS in the middle: the tokens before it are document 0
            [b, 4, 4, 4, b, 4, 4, 4],  # BOS at position 0: the first document is 1
            [1, 2, 3, 4, 5, 6, 7, 8],  # no BOS: one document, 0
            [b, b, 2, b, 3, 3, 3, b],  # back-to-back BOS and BOS last
        ]
    )
    ids = document_ids(inputs, BOS)
    assert ids.dtype == torch.int32 and ids.shape == inputs.shape
    assert ids.tolist() == [
        [0, 0, 1, 1, 1, 2, 2, 2],
        [1, 1, 1, 1, 2, 2, 2, 2],
        [0, 0, 0, 0, 0, 0, 0, 0],
        [1, 2, 2, 3, 3, 3, 3, 4],
    ]
    # another BOS id: the same tokens count differently
    assert document_ids(inputs, 4).tolist()[1] == [0, 1, 2, 3, 3, 4, 5, 6]


# --------------------------------------------------------------------------- block_causal on whole models


def test_block_causal_on_one_document_equals_causal(model):
    tokens = ordinary_tokens(3, SEQ, seed=1)
    tokens[1, 0] = BOS  # row 0: no BOS at all; row 1: BOS at position 0 only; row 2 none
    doc_ids = document_ids(tokens, BOS)
    assert doc_ids[0].unique().tolist() == [0] and doc_ids[1].unique().tolist() == [1]
    with torch.no_grad():
        causal = model(tokens)
        block = model(tokens, doc_ids=doc_ids)
    assert causal.shape == (3, SEQ, VOCAB)
    # Exactly equal (torch.equal, not a tolerance): the mask keeps the same keys as is_causal.
    assert torch.equal(block, causal), f"max abs diff {(block - causal).abs().max().item()}"


@pytest.mark.parametrize("lead_bos", [False, True])
def test_block_causal_does_not_leak_across_documents(model, lead_bos):
    split = 12  # doc A: positions [0, split); BOS at split; doc B: (split, SEQ)
    first = ordinary_tokens(2, SEQ, seed=2)
    first[:, split] = BOS
    if lead_bos:
        first[:, 0] = BOS
    second = first.clone()
    second[:, int(lead_bos) : split] = ordinary_tokens(2, split - int(lead_bos), seed=3)
    assert not torch.equal(first[:, :split], second[:, :split])
    assert torch.equal(first[:, split:], second[:, split:])
    with torch.no_grad():
        block = [model(t, doc_ids=document_ids(t, BOS)) for t in (first, second)]
        causal = [model(t) for t in (first, second)]
    diff_block = (block[0][:, split:] - block[1][:, split:]).abs().max().item()
    if model.name in MOE:
        # Attention does not leak here either, but the MoE's grouped matmul rounds a token's
        # expert output differently when other tokens change its expert's group size (~3e-8).
        assert diff_block <= 1e-6, f"doc B changed: max abs diff {diff_block}"
    else:
        assert torch.equal(block[0][:, split:], block[1][:, split:]), (
            f"doc B changed: max abs diff {diff_block}"
        )
    # doc A's own logits do change (its tokens did), and under causal doc B sees doc A
    assert not torch.equal(block[0][:, :split], block[1][:, :split])
    diff_causal = (causal[0][:, split:] - causal[1][:, split:]).abs().max().item()
    assert diff_causal > 1e-3, f"causal: doc B should see doc A; max abs diff {diff_causal}"


def test_eos_delimited_documents_do_not_leak(model):
    # A tokenizer without BOS (Qwen3's) packs text + EOS: a document ends at its EOS (which
    # stays with it) and the next starts after it. Doc A = [0, split] with EOS at split.
    eos, split = 1, 12
    first = ordinary_tokens(2, SEQ, seed=4).clamp(min=2)
    first[:, split] = eos
    second = first.clone()
    second[:, :split] = ordinary_tokens(2, split, seed=5).clamp(min=2)
    ids = document_ids(first, eos, starts=False)
    assert ids[0, : split + 1].unique().tolist() == [0] and ids[
        0, split + 1 :
    ].unique().tolist() == [1]
    with torch.no_grad():
        block = [model(t, doc_ids=document_ids(t, eos, starts=False)) for t in (first, second)]
    diff = (block[0][:, split + 1 :] - block[1][:, split + 1 :]).abs().max().item()
    assert diff <= (1e-6 if model.name in MOE else 0.0), f"doc B changed: max abs diff {diff}"
    # the EOS position itself belongs to doc A: its logits see doc A's changed tokens
    assert not torch.equal(block[0][:, split], block[1][:, split])


# --------------------------------------------------------------------------- context parallel chunks


@pytest.mark.parametrize("degree", [2, 4])
def test_shard_and_positions_cover_the_sequence_once(degree):
    seq = 8 * degree
    n = seq // (2 * degree)
    whole = torch.arange(seq).expand(2, seq)
    seen = []
    for r in range(degree):
        cp = ContextParallel(group=None, rank=r, degree=degree)
        assert cp.chunks == (r, 2 * degree - 1 - r)
        local = cp.shard(whole, dim=1)
        assert local.shape == (2, 2 * n)
        expected = list(range(r * n, (r + 1) * n)) + list(
            range((2 * degree - 1 - r) * n, (2 * degree - r) * n)
        )
        assert local[0].tolist() == local[1].tolist() == expected
        assert cp.positions(2 * n, torch.device("cpu")).tolist() == expected
        # another dim: [batch, heads, seq, d] sharded on dim 2
        assert cp.shard(whole.view(1, 2, seq, 1), dim=2)[0, 0, :, 0].tolist() == expected
        seen += expected
    assert sorted(seen) == list(range(seq))


@pytest.mark.parametrize("degree", [2, 4])
def test_gather_puts_every_rank_chunks_back_in_global_order(degree, monkeypatch):
    seq = 4 * degree
    whole = torch.arange(3 * seq, dtype=torch.float32).view(1, seq, 3)
    ranks = [ContextParallel(group=None, rank=r, degree=degree) for r in range(degree)]
    locals_ = [cp.shard(whole) for cp in ranks]

    def fake_all_gather(
        x, gather_dim, group
    ):  # rank-major concatenation, as the collective returns
        assert gather_dim == 1 and group is None
        return torch.cat(locals_, dim=1)

    monkeypatch.setattr(context_parallel, "all_gather_single_autograd", fake_all_gather)
    monkeypatch.setattr(context_parallel, "wait_tensor", lambda t: t)
    for cp, local in zip(ranks, locals_):
        assert torch.equal(cp.gather(local), whole)


def test_attention_inputs_without_cp():
    rope = torch.randn(SEQ, 4)
    causal = attention_inputs(16, rope)
    assert causal.mask is None and causal.cp is None and causal.chunk_keys is None
    assert torch.equal(causal.rope, rope[:16])
    doc_ids = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    block = attention_inputs(4, rope, doc_ids)
    assert block.mask.shape == (2, 1, 4, 4)
    assert block.mask[0, 0].int().tolist() == [
        [1, 0, 0, 0],
        [1, 1, 0, 0],
        [0, 0, 1, 0],
        [0, 0, 1, 1],
    ]
    assert block.mask[1, 0].int().tolist() == torch.ones(4, 4).tril().int().tolist()


def test_causal_chunk_mask_is_lower_right():
    assert causal_chunk_mask(2, 6, "cpu").int().tolist() == [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]]
    assert causal_chunk_mask(3, 3, "cpu").int().tolist() == torch.ones(3, 3).tril().int().tolist()


def test_simulation_leaves_the_cpu_chunk_masks_of_a_cuda_job_uncounted():
    # planning/simulate/patches.py wraps the module's causal_chunk_mask, which the chunks'
    # masks must go through: a CUDA job never materializes them
    from torchtitan.planning.simulate.patches import cuda_causal_bias

    paused = []

    class Tracker:
        @contextlib.contextmanager
        def paused(self):
            paused.append(True)
            yield

    cp = ContextParallel(group=None, rank=0, degree=2)
    with cuda_causal_bias(Tracker(), "cpu"):
        cp.chunk_keys(8, None, torch.device("cpu"))
    assert paused == []
    with cuda_causal_bias(Tracker(), "cuda"):
        chunks = cp.chunk_keys(8, None, torch.device("cpu"))
    assert paused == [True, True] and [end for end, _ in chunks] == [4, 16]
    assert context_parallel.causal_chunk_mask is causal_chunk_mask  # restored


def doc_ids_of(bsz: int, seq: int) -> torch.Tensor:
    """Windows with several documents, BOS on and off chunk boundaries, and one without BOS."""
    starts = torch.zeros(bsz, seq, dtype=torch.bool)
    starts[0, [0, 5, 8, seq - 3]] = True
    starts[1, [3, seq // 2, seq // 2 + 1, seq - 1]] = True
    return torch.cumsum(starts, dim=1, dtype=torch.int32)  # row 2 (if any): one document


@pytest.mark.parametrize("degree", [2, 4])
@pytest.mark.parametrize("mask", ["causal", "block_causal"])
def test_cp_attention_equals_whole_sequence_sdpa(degree, mask):
    bsz, heads, seq, dim = 3, 2, 8 * degree, 8
    g = torch.Generator().manual_seed(degree)
    q, k, v = (torch.randn(bsz, heads, seq, dim, generator=g) for _ in range(3))
    rope = torch.randn(seq, 4, generator=g)
    doc_ids = doc_ids_of(bsz, seq) if mask == "block_causal" else None
    if doc_ids is None:
        expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        allowed = (doc_ids[:, :, None] == doc_ids[:, None, :]) & torch.ones(
            seq, seq, dtype=torch.bool
        ).tril()
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed.unsqueeze(1))
    out = torch.full_like(q, float("nan"))
    for r in range(degree):
        cp = ContextParallel(group=None, rank=r, degree=degree)
        local_len = seq // degree
        inputs = attention_inputs(local_len, rope, doc_ids, cp)
        assert isinstance(inputs, AttentionInputs) and inputs.cp is cp and inputs.mask is None
        positions = cp.positions(local_len, torch.device("cpu"))
        assert torch.equal(inputs.rope, rope[positions])
        n = local_len // 2
        assert [end for end, _ in inputs.chunk_keys] == [(c + 1) * n for c in cp.chunks]
        # the gathered keys and values are the whole sequence's, in global order
        out[:, :, positions] = attend(cp.shard(q, dim=2), k, v, inputs)
    assert not out.isnan().any()
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)


def test_cp_attention_passes_the_scale():
    degree, seq = 2, 16
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, seq, 4, generator=g) for _ in range(3))
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.1)
    out = torch.empty_like(q)
    for r in range(degree):
        cp = ContextParallel(group=None, rank=r, degree=degree)
        inputs = attention_inputs(seq // degree, torch.zeros(seq, 2), None, cp)
        out[:, :, cp.positions(seq // degree, "cpu")] = attend(
            cp.shard(q, dim=2), k, v, inputs, scale=0.1
        )
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)
