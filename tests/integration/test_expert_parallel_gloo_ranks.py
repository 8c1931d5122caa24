"""Expert parallelism on 2 gloo ranks (CPU): parameter sharding, token dispatch/combine against
a single-process reference, and what an op-level SAC policy sees and saves.

All distributed scenarios run in ONE spawn of 2 ranks (start-up dominates the cost); each rank
writes its measurements to a file and the tests below assert on them."""

import contextlib
import copy
import datetime
import functools
import gc
import os
import socket
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import CheckpointPolicy

from torchtitan.distributed.expert_parallel import (
    SAC_SAVE_OPS,
    AllToAllDispatcher,
    apply_expert_parallel,
)
from torchtitan.models.common.moe import LocalDispatcher

WORLD = 2
DIM, HIDDEN = 8, 16
# rows each rank sends to each of 8 global experts (E_local = 4): rank 0 sends nothing to
# rank 1, experts 1, 4 and 7 get no rows at all; in the second pattern rank 1 has no tokens
PATTERNS = {
    "uneven": [[3, 0, 2, 1, 0, 0, 0, 0], [1, 0, 2, 0, 0, 5, 3, 0]],
    "empty_rank": [[2, 1, 0, 0, 0, 3, 0, 1], [0] * 8],
}


class StandInExperts(nn.Module):
    """The GroupedExperts interface: w1/w3 [E, hidden, dim], w2 [E, dim, hidden]; forward(x
    sorted by expert, counts [E_local]) -> SwiGLU per expert, E_local = local weight dim 0."""

    def __init__(self, num_experts: int, grouped_mm: bool = True):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(num_experts, HIDDEN, DIM) * 0.2)
        self.w2 = nn.Parameter(torch.randn(num_experts, DIM, HIDDEN) * 0.2)
        self.w3 = nn.Parameter(torch.randn(num_experts, HIDDEN, DIM) * 0.2)
        self.grouped_mm = grouped_mm

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        w1, w2, w3 = (
            w.to_local() if hasattr(w, "to_local") else w for w in (self.w1, self.w2, self.w3)
        )
        assert counts.shape == (w1.shape[0],)
        if self.grouped_mm:
            offs = torch.cumsum(counts, 0).to(torch.int32)
            h = nn.functional.silu(torch._grouped_mm(x, w1.transpose(-2, -1), offs=offs))
            h = h * torch._grouped_mm(x, w3.transpose(-2, -1), offs=offs)
            return torch._grouped_mm(h, w2.transpose(-2, -1), offs=offs)
        outs = []  # the per-expert loop reference
        for e, rows in enumerate(x.split(counts.tolist())):
            outs.append((nn.functional.silu(rows @ w1[e].t()) * (rows @ w3[e].t())) @ w2[e].t())
        return torch.cat(outs)


class Owner(nn.Module):
    """What a MoE layer is to EP: it owns `experts` and a dispatcher, and sends its sorted
    rows through `dispatcher(experts, x, counts)` with counts per GLOBAL expert."""

    def __init__(self, experts: nn.Module):
        super().__init__()
        self.experts = experts
        self.dispatcher = LocalDispatcher()

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        return self.dispatcher(self.experts, x, counts)


def _data(counts):
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(sum(c), DIM, generator=g) for c in counts]
    return xs, [torch.randn(x.shape, generator=g) for x in xs]  # contiguous upstream grads


def _max_diff(a, b) -> float:
    return 0.0 if a.numel() == 0 else (a - b).abs().max().item()


class _CountAllToAll(TorchDispatchMode):
    """Counts the all-to-all collectives that actually run (SAC replays skip the dispatch)."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += "all_to_all" in func.name()
        return func(*args, **(kwargs or {}))


def _routing(rank, mesh, counts_all):
    """EP forward/backward vs the per-expert loop on one process with all experts."""
    torch.manual_seed(0)
    full = StandInExperts(8, grouped_mm=False)
    ep = Owner(copy.deepcopy(full))
    ep.experts.grouped_mm = True
    apply_expert_parallel(ep, mesh)
    assert isinstance(ep.dispatcher, AllToAllDispatcher)
    xs, gs = _data(counts_all)
    loss, x_refs, y_refs = 0, [], []
    for x, g, c in zip(xs, gs, counts_all):  # reference: both ranks' tokens, all experts
        x_refs.append(x.clone().requires_grad_())
        y_refs.append(full(x_refs[-1], torch.tensor(c)))
        loss = loss + (y_refs[-1] * g).sum()
    loss.backward()
    x = xs[rank].clone().requires_grad_()
    y = ep(x, torch.tensor(counts_all[rank]))
    (y * gs[rank]).sum().backward()
    lo, hi = rank * 4, rank * 4 + 4
    ep = ep.experts
    return {
        "y": _max_diff(y, y_refs[rank]),
        "x_grad": _max_diff(x.grad, x_refs[rank].grad),
        "y_plain": type(y) is torch.Tensor,
        "w_grad": max(
            _max_diff(getattr(ep, n).grad.to_local(), getattr(full, n).grad[lo:hi])
            for n in ("w1", "w2", "w3")
        ),
        "w_local": max(
            _max_diff(getattr(ep, n).to_local(), getattr(full, n).detach()[lo:hi])
            for n in ("w1", "w2", "w3")
        ),
        "grad_shard0": all(
            getattr(ep, n).grad.placements == (Shard(0),) for n in ("w1", "w2", "w3")
        ),
    }


def _params(rank, mesh):
    def describe(m):
        return {
            n: (
                isinstance(p, nn.Parameter) and isinstance(p, DTensor),
                p.placements == (Shard(0),),
                p.device_mesh is mesh,
                tuple(p.shape),
                tuple(p.to_local().shape),
                p.to_local().device.type,
            )
            for n, p in m.named_parameters()
        }

    with torch.device("meta"):
        owner = Owner(StandInExperts(4))
    apply_expert_parallel(owner, mesh)
    m = owner.experts
    on_meta = describe(m)
    before = dict(m.named_parameters())
    apply_expert_parallel(owner, mesh)  # a second call on the same mesh is a no-op
    same = all(p is before[n] for n, p in m.named_parameters())
    m.to_empty(device="cpu")
    with torch.no_grad():
        for p in m.parameters():
            p.normal_()  # a layout-independent init on the materialised shards
    try:
        apply_expert_parallel(Owner(StandInExperts(3)), mesh)
        error = None
    except ValueError as e:
        error = str(e)
    return {"meta": on_meta, "materialised": describe(m), "again_noop": same, "error": error}


def _sac(rank, mesh, mode):
    """One checkpointed EP call: what the policy sees, how many all-to-alls backward runs."""
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    from torchtitan.distributed.activation_checkpoint import RegionSpec, region_policy

    torch.manual_seed(0)
    ep = Owner(StandInExperts(8))
    apply_expert_parallel(ep, mesh)
    counts_all = PATTERNS["uneven"]
    xs, gs = _data(counts_all)
    counts = torch.tensor(counts_all[rank])
    seen = []

    # the production policy of a region holding the experts (op SAC keeps EP's collectives)
    decide = region_policy(
        RegionSpec("op" if mode == "save" else "full", None), frozenset(), frozenset(SAC_SAVE_OPS)
    )

    def policy(ctx, func, *args, **kwargs):
        decision = decide(ctx, func, *args, **kwargs)
        if func.namespace != "aten":
            seen.append((ctx.is_recompute, str(func), decision))
        return decision

    def region(x):
        return nn.functional.silu(ep(x * 1.5, counts))

    x = xs[rank].clone().requires_grad_()
    if mode == "none":
        y = region(x)
    else:
        context_fn = functools.partial(create_selective_checkpoint_contexts, policy)
        y = checkpoint(region, x, use_reentrant=False, context_fn=context_fn)
    counter = _CountAllToAll()
    with counter:
        (y * gs[rank]).sum().backward()
    return {
        "seen": seen,
        "backward_all_to_all": counter.n,
        "y": y.detach(),
        "x_grad": x.grad,
        "w_grad": [w.grad.to_local() for w in (ep.experts.w1, ep.experts.w2, ep.experts.w3)],
    }


def _worker(rank, port, out_dir):
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=30),
    )
    results = {}
    try:
        mesh = init_device_mesh("cpu", (WORLD,))
        for name, counts in PATTERNS.items():
            results[f"routing/{name}"] = _routing(rank, mesh, counts)
        results["params"] = _params(rank, mesh)
        for mode in ("none", "save", "recompute"):
            results[f"sac/{mode}"] = _sac(rank, mesh, mode)
    except Exception:
        results["error"] = traceback.format_exc()
        raise
    finally:
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        # every rank done with its collectives before any tears gloo down: a rank that
        # destroyed its group while a peer was still in one aborted the peer on exit
        # ("terminate called without an active exception", twice in make test on 2 cores)
        if "error" not in results:
            dist.barrier()
        gc.collect()  # as distributed/process_groups.shutdown_distributed: no work object left
        dist.destroy_process_group()


def _free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    if not dist.is_available():
        pytest.skip("torch.distributed is not available in this build")
    out_dir = str(tmp_path_factory.mktemp("ep"))
    mp.spawn(_worker, args=(_free_port(), out_dir), nprocs=WORLD, join=True)
    return [
        torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False) for r in range(WORLD)
    ]


@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_dispatch_combine_matches_single_rank(ranks, pattern):
    for rank, res in enumerate(ranks):
        r = res[f"routing/{pattern}"]
        assert r["w_local"] == 0.0, rank  # each rank holds its slice of the full weights
        assert r["y"] < 1e-6 and r["x_grad"] < 1e-6, (rank, r)
        assert r["w_grad"] < 1e-6, (rank, r)  # local shard grads = slices of the full grads
        assert r["grad_shard0"] and r["y_plain"], (rank, r)


def test_parameters_become_shard0_dtensors_also_on_meta(ranks):
    for res in ranks:
        p = res["params"]
        for state, device in (("meta", "meta"), ("materialised", "cpu")):
            assert set(p[state]) == {"w1", "w2", "w3"}
            for name, (is_dparam, shard0, on_mesh, shape, local_shape, dev) in p[state].items():
                assert is_dparam and shard0 and on_mesh and dev == device, (state, name)
                assert shape[0] == 4 and local_shape == (2, *shape[1:]), (state, name)
        assert p["again_noop"]
        assert p["error"] is not None and "3" in p["error"] and "2" in p["error"], p["error"]


def test_sac_policy_saves_the_collectives_and_recompute_stays_correct(ranks):
    for rank, res in enumerate(ranks):
        base, save, full = res["sac/none"], res["sac/save"], res["sac/recompute"]
        for mode in (save, full):  # checkpointing never changes values or grads
            torch.testing.assert_close(mode["y"], base["y"], atol=1e-6, rtol=0)
            torch.testing.assert_close(mode["x_grad"], base["x_grad"], atol=1e-6, rtol=0)
            for a, b in zip(mode["w_grad"], base["w_grad"]):
                torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
        # the policy sees each collective (counts, dispatch, combine) in forward, all in SAC_SAVE_OPS
        fwd = [f for is_re, f, _ in save["seen"] if not is_re]
        # op SAC saves all 9 (3 x all-to-all, wrap, its paired wait); full AC recomputes them
        assert [d for _, _, d in save["seen"]] == [CheckpointPolicy.MUST_SAVE] * 9, save["seen"]
        assert [d for _, _, d in full["seen"]] == [CheckpointPolicy.PREFER_RECOMPUTE] * 9, full[
            "seen"
        ]
        assert fwd.count("_c10d_functional.all_to_all_single.default") == 3
        assert fwd.count("_c10d_functional.wait_tensor.default") == 3
        assert {str(op) for op in SAC_SAVE_OPS} >= set(fwd)
        # backward without AC runs the 2 reverse all-to-alls and saving adds none; full
        # recompute re-runs the counts exchange, the dispatch and (silu needs its output) the combine
        assert base["backward_all_to_all"] == save["backward_all_to_all"] == 2, rank
        assert full["backward_all_to_all"] == 5, rank
