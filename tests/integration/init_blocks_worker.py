"""Run by test_init_blocks_fake_world.py in a fresh process: weight init in row blocks on a fake
8-rank world (every rank's shard computed in turn), and its peak memory."""

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from torch.distributed.tensor.placement_types import _StridedShard
from torch.testing._internal.distributed.fake_pg import FakeStore

from torchtitan.models.common.init import _generator, init_in_blocks, normal, trunc_normal


def peak_rss_kib() -> int:
    """This process's peak resident set (VmHWM). Not ru_maxrss: Linux keeps that across
    execve, so a child of a large process (pytest) would start from its parent's peak."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def _fake_world(rank: int, world: int = 8) -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)


def equality() -> dict:
    """Every rank's shard == its rows and columns of the same tensor initialised on one rank
    (blocks of 16 and 48 elements: several blocks; 2**30: one whole-tensor draw)."""
    checked = 0
    cases = [  # (shape, mesh shape, placements, init): FSDP x TP rowwise, FSDP over TP colwise, uneven
        ((37, 6), (4, 2), (Shard(0), Shard(1)), trunc_normal(0.02)),
        ((40, 8), (4, 2), (_StridedShard(0, split_factor=2), Shard(0)), normal(1.0)),
        ((101,), (8,), (Shard(0),), normal(1.0)),
    ]
    for rank in range(8):
        _fake_world(rank)
        for shape, mesh_shape, placements, init in cases:
            mesh = init_device_mesh("cpu", mesh_shape)
            for chunk in (16, 48, 1 << 30):
                whole = torch.empty(shape)
                init_in_blocks(
                    whole, init, "w", 0, "cpu", chunk_elements=chunk
                )  # one rank: a plain tensor
                if chunk == 1 << 30:  # one block is exactly one draw of the whole tensor
                    one_draw = torch.empty(shape)
                    init(one_draw, _generator("w", 0, "cpu"))
                    assert torch.equal(whole, one_draw)
                expected = distribute_tensor(whole, mesh, placements, src_data_rank=None)
                param = distribute_tensor(torch.zeros(shape), mesh, placements, src_data_rank=None)
                init_in_blocks(param, init, "w", 0, "cpu", chunk_elements=chunk)
                assert torch.equal(param.to_local(), expected.to_local()), (
                    rank,
                    shape,
                    placements,
                    chunk,
                )
                checked += 1
    return {"checked": checked}


def peak(chunk: int) -> dict:
    """Peak resident-memory growth of rank 3 of 8 initialising a 128256 x 256 embedding
    (fp32: 125 MiB whole, 16 MiB per rank)."""
    _fake_world(3)
    mesh = init_device_mesh("cpu", (8,))
    shape = (128256, 256)
    local = torch.zeros(shape[0] // 8, shape[1])  # rank 3's shard, touched before the baseline
    param = DTensor.from_local(local, mesh, (Shard(0),), shape=shape, stride=(shape[1], 1))
    base = peak_rss_kib()
    init_in_blocks(param, normal(1.0), "w", 0, "cpu", chunk_elements=chunk)
    grown = (peak_rss_kib() - base) / 1024
    return {"peak_growth_mib": round(grown, 1), "shard_mib": round(local.numel() * 4 / 2**20, 1)}


if __name__ == "__main__":
    mode = sys.argv[1]
    out = equality() if mode == "equality" else peak(int(sys.argv[2]))
    print(json.dumps(out))
