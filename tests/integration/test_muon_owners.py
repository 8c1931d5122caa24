"""Muon's orthogonalization of sharded matrices (training/muon_owners.py) on 4 gloo ranks:
every placement the layouts give a matrix (FSDP's Shard(0), TP's row and column shards, FSDP
over TP's _StridedShard, rows split over two dimensions, uneven shards, routed experts' stacks sharded by expert or within
each expert, replicated) comes back bitwise what Newton-Schulz of the whole matrix gives, in
both modes and both exchange precisions; each owner iterates on exactly its share (over both
dimensions of an FSDP x TP mesh); and the collectives each mode issues, by kind and bytes.

One spawn of 4 ranks runs every scenario (start-up dominates); rank 0 writes what it saw."""

import json
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.placement_types import _StridedShard

from torchtitan.observe.comm_stats import CommStats
from torchtitan.training.muon import newton_schulz
from torchtitan.training.muon_owners import Orthogonalizer

WORLD = 4
COEF = (3.4445, -4.775, 2.0315)
# six matrices of an FSDP unit over 4 ranks (two of them unevenly: 10 and 7 rows)
FSDP_SHAPES = [(16, 8), (8, 16), (12, 12), (10, 6), (7, 9), (8, 8)]


def _cases(m1, m2):
    """(name, whole tensor, mesh, placements) of every placement under test."""
    torch.manual_seed(0)
    g = [torch.randn(s) for s in [(6, 10), (8, 12), (12, 4), (3, 5, 7), (4, 6, 5), (9, 7)]]
    return [
        ("fsdp_uneven_rows", g[5], m1, [Shard(0)]),
        ("tp_row_shards", g[1], m2, [Replicate(), Shard(1)]),
        ("tp_column_shards", g[2], m2, [Replicate(), Shard(0)]),
        ("fsdp_over_tp", g[0], m2, [_StridedShard(0, split_factor=2), Shard(0)]),
        ("fsdp_and_tp_2d", g[1], m2, [Shard(0), Shard(1)]),
        ("both_split_rows", g[1], m2, [Shard(0), Shard(0)]),
        ("experts_by_expert", g[3], m1, [Shard(0)]),  # rank 3 holds no expert
        ("experts_within", g[4], m2, [Shard(0), Shard(1)]),
        ("replicated", g[2], m2, [Replicate(), Replicate()]),
    ]


def _dtensor(whole, mesh, placements):
    if isinstance(placements[0], _StridedShard):  # FSDP2's shards of a TP shard
        rows = whole.chunk(2, 0)[mesh.get_local_rank(1)].chunk(2, 0)[mesh.get_local_rank(0)]
        return DTensor.from_local(
            rows, mesh, placements, run_check=False, shape=whole.shape, stride=whole.stride()
        )
    return distribute_tensor(whole, mesh, placements)


def _ns(dtype, calls):
    def ns(x):
        calls.append(tuple(x.shape))
        return newton_schulz(x, COEF, 5, 1e-7, dtype)

    return ns


def _worker(rank: int, port: int, out_path: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    m1 = init_device_mesh("cpu", (4,), mesh_dim_names=("dp_shard",))
    m2 = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_shard", "tp"))
    dims = {
        m1.get_group(0).group_name: "dp_shard",
        m2.get_group(0).group_name: "dp_shard2",
        m2.get_group(1).group_name: "tp",
    }
    seen = {"exact": {}, "calls": {}, "counts": {}, "bytes": {}}
    cases = _cases(m1, m2)
    updates = [_dtensor(w, m, p) for _, w, m, p in cases]
    for mode in ("owner", "every_rank"):
        for dtype in (torch.float32, torch.bfloat16):
            calls = []
            got = Orthogonalizer(mode, dtype)(updates, _ns(dtype, calls))
            for (name, whole, _, _), u, o in zip(cases, updates, got):
                same = o.placements == u.placements and o.to_local().shape == u.to_local().shape
                want = newton_schulz(whole, COEF, 5, 1e-7, dtype)
                seen["exact"][f"{mode}/{dtype}/{name}"] = same and torch.equal(
                    o.full_tensor(), want
                )
    torch.manual_seed(1)
    fsdp = [distribute_tensor(torch.randn(s), m1, [Shard(0)]) for s in FSDP_SHAPES]
    for mode in ("owner", "every_rank"):
        calls = []
        stats = CommStats(dims)
        with stats:
            Orthogonalizer(mode, torch.bfloat16)(fsdp, _ns(torch.bfloat16, calls))
        counts, nbytes = stats.reset()
        seen["calls"][mode] = calls
        seen["counts"][mode], seen["bytes"][mode] = counts, nbytes
    # FSDP over TP (2 x 2): eight matrices, owners spread over both dimensions
    torch.manual_seed(2)
    strided = [_StridedShard(0, split_factor=2), Shard(0)]
    two_d = [_dtensor(torch.randn(16, 16), m2, strided) for _ in range(8)]
    calls = []
    stats = CommStats(dims)
    with stats:
        Orthogonalizer("owner", torch.bfloat16)(two_d, _ns(torch.bfloat16, calls))
    seen["calls"]["fsdp_over_tp"] = calls
    seen["counts"]["fsdp_over_tp"] = stats.reset()[0]
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(seen, f)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def seen(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("muon_owners") / "seen.json")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # from the fork server (the suite's fast launcher keeps one with torchtitan imported):
    # a spawn re-imports torch in each rank (4x on 2 cores); a plain fork of this process,
    # whose threads may hold locks, can hang
    mp.start_processes(
        _worker, args=(port, path), nprocs=WORLD, join=True, start_method="forkserver"
    )
    with open(path) as f:
        return json.load(f)


def test_every_placement_is_orthogonalized_whole_bitwise(seen):
    assert len(seen["exact"]) == 2 * 2 * 9
    assert [k for k, ok in seen["exact"].items() if not ok] == []


def test_owners_iterate_on_their_share(seen):
    # by cost (elements x shorter side), largest first to the least loaded: 12x12 (1728) to
    # rank 0, the two 1024s to ranks 1 and 2, 8x8 (512) and 7x9 (441) to rank 3, 10x6 (360)
    # to rank 1; every_rank iterates on all six on every rank
    assert seen["calls"]["owner"] == [[12, 12]]
    assert seen["calls"]["every_rank"] == [list(s) for s in FSDP_SHAPES]
    # FSDP over TP: 8 equal matrices over 2 x 2 owners, two each (not four: both dimensions)
    assert seen["calls"]["fsdp_over_tp"] == [[16, 16]] * 2


def test_collectives_each_mode_adds(seen):
    # owner: one all_to_all there and one back, bf16 (2 bytes), counted as the larger of what
    # this rank sends and receives; every_rank: one all-gather per matrix, fp32 whole
    assert seen["counts"]["owner"] == {"other/all_to_all/dp_shard": 2}
    assert seen["counts"]["every_rank"] == {"other/all_gather/dp_shard": 6}
    # rank 0 sends its shard of each of the six, receives every shard of the 12x12 it owns
    sent = sum(Shard.local_shard_size_and_offset(r, WORLD, 0)[0] * c for r, c in FSDP_SHAPES)
    assert seen["bytes"]["owner"] == {"other/all_to_all/dp_shard": 2 * 2 * max(sent, 12 * 12)}
    # DTensor pads uneven shards to the largest before gathering (10 rows as 4 x 3)
    padded = sum(-(-r // WORLD) * WORLD * c for r, c in FSDP_SHAPES)
    assert seen["bytes"]["every_rank"] == {"other/all_gather/dp_shard": 4 * padded}
    # FSDP over TP: a hop over each dimension, there and back
    assert seen["counts"]["fsdp_over_tp"] == {
        "other/all_to_all/dp_shard2": 2,
        "other/all_to_all/tp": 2,
    }
