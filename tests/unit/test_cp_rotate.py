"""Context parallel's rotate method alltoall (ring attention) and its load balancers, in this
process: every CP rank of a ring is run in turn, the hop between ranks replaced by handing over
the next rank's K/V (slices of the same leaf tensors, so gradients sum over the ranks as the
autograd all-to-all sums them). Outputs and gradients must equal one SDPA over the whole
sequence. The real collectives, their counts and the parity of whole runs:
tests/integration/test_cp_rotate_run.py and feature_cases.py."""

import pytest
import torch
import torch.nn.functional as F

from torchtitan.distributed import ring_attention
from torchtitan.distributed.context_parallel import ContextParallel, configured

B, H, SEQ = 2, 3, 48


def _full(q, k, v, doc_ids):
    if doc_ids is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    mask = (doc_ids[:, :, None] == doc_ids[:, None, :]) & torch.ones(
        SEQ, SEQ, dtype=torch.bool
    ).tril()
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.unsqueeze(1))


def _ring(q, k, v, doc_ids, degree, balancer, monkeypatch):
    """Every rank's ring attention, put back in global order; the hops each rank made."""
    out = torch.empty(B, H, SEQ, v.shape[-1])
    hops = []
    for rank in range(degree):
        cp = ContextParallel(None, rank, degree, balancer=balancer, rotate="alltoall")
        local = [cp.shard(t, dim=2) for t in (q, k, v)]
        others = [
            torch.cat(
                [ContextParallel(None, s, degree, balancer).shard(t, dim=2) for t in (k, v)],
                dim=-1,
            )
            for s in range(degree)
        ]
        made = []

        def shift(x, cp, made=made, rank=rank, others=others):
            assert x.shape == others[0].shape  # K and V travel as one tensor
            made.append(x)
            return others[(rank - len(made)) % degree]

        monkeypatch.setattr(ring_attention, "shift", shift)
        keys = cp.chunk_keys(local[0].shape[2], doc_ids, q.device)
        got = cp.attend(*local, keys)
        out[:, :, cp.positions(local[0].shape[2], q.device)] = got
        hops.append(len(made))
    return out, hops


@pytest.mark.parametrize("degree", [2, 4])
@pytest.mark.parametrize("balancer", ["headtail", "none"])
@pytest.mark.parametrize("docs", [False, True])
@pytest.mark.parametrize("v_dim", [8, 4])  # 4: MLA's narrower value head
def test_ring_attention_equals_full_attention(degree, balancer, docs, v_dim, monkeypatch):
    torch.manual_seed(0)
    q, k = (torch.randn(B, H, SEQ, 8, requires_grad=True) for _ in range(2))
    v = torch.randn(B, H, SEQ, v_dim, requires_grad=True)
    doc_ids = None
    if docs:  # a document starts mid-chunk; batch row 1 has a document of one token
        doc_ids = torch.zeros(B, SEQ, dtype=torch.int32)
        doc_ids[0, 5:] = 1
        doc_ids[0, 30:] = 2
        doc_ids[1, 13:] = 1
        doc_ids[1, 14:] = 2
    want = _full(q, k, v, doc_ids)
    got, hops = _ring(q, k, v, doc_ids, degree, balancer, monkeypatch)
    assert hops == [degree - 1] * degree  # one hop per round but the last
    torch.testing.assert_close(got, want, rtol=0, atol=2e-6)
    g = torch.randn_like(want)
    want_grads = torch.autograd.grad(want, (q, k, v), g)
    got_grads = torch.autograd.grad(got, (q, k, v), g)
    for w, a in zip(want_grads, got_grads):
        torch.testing.assert_close(a, w, rtol=0, atol=1e-5)


def test_a_fully_masked_pair_gives_no_nan():
    # a query row that sees no key of a chunk (another document) merges to 0 weight
    q = torch.randn(1, 1, 4, 8, requires_grad=True)
    k, v = torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8)
    out, lse = ring_attention._block(q, k, v, torch.zeros(4, 4, dtype=torch.bool), 1.0)
    own, own_lse = ring_attention._block(q, k, v, None, 1.0)
    merged, _ = ring_attention._merge((out, lse), own, own_lse)
    assert torch.equal(merged, own)
    merged.sum().backward()
    assert torch.isfinite(q.grad).all()


@pytest.mark.parametrize(
    "balancer, chunks, pieces",
    [("headtail", [(0, 7), (1, 6), (2, 5), (3, 4)], 8), ("none", [(0,), (1,), (2,), (3,)], 4)],
)
def test_balancers_deal_chunks(balancer, chunks, pieces):
    cps = [ContextParallel(None, r, 4, balancer=balancer) for r in range(4)]
    assert [cp.chunks for cp in cps] == chunks and cps[0].pieces == pieces
    t = torch.arange(16).view(1, 16)
    got = [cp.shard(t).tolist()[0] for cp in cps]
    assert sorted(x for g in got for x in g) == list(range(16))  # every token once
    assert [cp.positions(4, "cpu").tolist() for cp in cps] == got  # positions = token ids
    if balancer == "none":
        assert got[1] == [4, 5, 6, 7]


def test_configured_takes_the_parallelism_keys():
    from torchtitan.config.job_config import Parallelism

    p = Parallelism(
        context_parallel_rotate_method="alltoall", context_parallel_load_balancer="none"
    )
    cp = configured(ContextParallel(None, 1, 2), p)
    assert (cp.rotate, cp.balancer, cp.rank, cp.degree) == ("alltoall", "none", 1, 2)
    assert configured(None, p) is None
    x = torch.randn(2, 6, 3)
    assert cp.gather(x) is x  # alltoall gathers nothing: attend rotates K/V itself


def test_ptrr_is_refused_in_one_line():
    from config_helpers import config_error

    argv = [
        "--parallelism.context_parallel_degree=2",
        "--parallelism.context_parallel_load_balancer=ptrr",
    ]
    assert config_error(argv, world_size=2) == (
        "--parallelism.context_parallel_load_balancer=ptrr is FlexAttention's per-document"
        " balancer and CP here runs SDPA, not FlexAttention; use headtail (or none)"
    )


def test_contiguous_chunks_need_seq_len_a_multiple_of_cp_only():
    from config_helpers import config_error

    from torchtitan.checks import load_config

    none = "--parallelism.context_parallel_load_balancer=none"
    cfg, _ = load_config(
        ["--parallelism.context_parallel_degree=4", none, "--training.seq_len=36"], 4
    )
    assert cfg.training.seq_len == 36  # 36 = 4 chunks of 9; headtail would need 8 | 36
    assert config_error(
        ["--parallelism.context_parallel_degree=4", none, "--training.seq_len=34"], world_size=4
    ) == (
        "--parallelism.context_parallel_degree=4 cuts each sequence into 4 chunks but"
        " --training.seq_len=34 is not a multiple of 4; pick a seq_len that is"
    )


@pytest.mark.parametrize("balancer", ["headtail", "none"])
def test_every_hop_takes_part_in_backward(balancer, monkeypatch):
    # Each hop's backward is a collective: a rank whose output does not depend on the last K/V
    # it received (balancer none: rank r sees nothing of rank r + 1's chunk) would skip it
    # while the others wait. Every received tensor must get a gradient, zero or not.
    degree = 4
    for rank in range(degree):
        cp = ContextParallel(None, rank, degree, balancer=balancer, rotate="alltoall")
        q, k, v = (torch.randn(1, 1, 16, 4) for _ in range(3))
        received = []

        def shift(x, cp, received=received):
            received.append(torch.randn(x.shape, requires_grad=True))
            return x * 0 + received[-1]  # a hop's output depends on its input, as a2a's does

        monkeypatch.setattr(ring_attention, "shift", shift)
        out = cp.attend(q, k, v, cp.chunk_keys(16, None, q.device))
        out.sum().backward()
        assert len(received) == degree - 1
        assert all(r.grad is not None for r in received), (balancer, rank)
