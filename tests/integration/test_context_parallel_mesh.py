"""Context parallel's mesh on fake process groups, in a child process (so that no group is
created in the test process): dp_shard x cp for FSDP and the loss, the data split over
dp_shard only, CP's own K/V group apart from FSDP's, EP taking all of cp before dp_shard.
(The config check and the job's degrees: tests/unit/test_context_parallel_config.py.)"""

import json
import subprocess
import sys

import pytest

SCRIPT = r"""
import json, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from torchtitan.distributed.parallel_dims import ParallelDims
from torchtitan.distributed.plan import UnitKind
out = {}
# name: (world, rank, dp_replicate, dp_shard, cp, tp, ep)
for name, (world, rank, r, s, c, t, e) in {
        "cp2_tp2": (8, 0, 1, 2, 2, 2, 1), "cp2_tp2_rank5": (8, 5, 1, 2, 2, 2, 1), "cp_only": (2, 0, 1, 1, 2, 1, 1),
        "hsdp_cp": (8, 0, 2, 2, 2, 1, 1), "ep4_cp2": (8, 0, 1, 4, 2, 1, 4)}.items():
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    d = ParallelDims(r, s, t, 1, e, world, c)
    d.build_mesh("cpu")
    dense = d.dp_mesh(UnitKind.DENSE)
    mesh_cp, cp = d.mesh["cp"].get_group(), d.cp_group()
    fsdp = d.fsdp_group_names()
    out[name] = {
        "shape": d.mesh_shape, "dense_dims": [x.value for x in dense.dims], "dense_shard": dense.shard.value,
        "dense_size": dense.size(dense.shard), "loss": [d.loss_mesh().mesh_dim_names, d.loss_mesh().size()],
        "data": [d.data_mesh().mesh_dim_names, d.data_mesh().size()], "dp_rank": d.dp_rank(),
        "cp_rank": d.cp_rank(), "cp_is_mesh_cp": cp is mesh_cp, "cp_ranks": dist.get_process_group_ranks(cp),
        "mesh_cp_ranks": dist.get_process_group_ranks(mesh_cp), "cp_in_fsdp": cp.group_name in fsdp,
        "n_fsdp": len(fsdp), "cp_named": d.named_groups()[cp.group_name],
        "ep_ranks": dist.get_process_group_ranks(d.ep_mesh().get_group()) if e > 1 else None,
        "experts": [list(d.dp_mesh(UnitKind.EXPERTS).mesh.shape), d.dp_mesh(UnitKind.EXPERTS).divide_factor],
    }
    dist.destroy_process_group()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def meshes(subprocess_env):
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_mesh_dp_shard_cp_tp(meshes):
    got = meshes["cp2_tp2"]
    assert got["shape"] == {"dp_shard": 2, "cp": 2, "tp": 2}
    # dense FSDP shards over dp_shard x cp; losses average over the same 4 token-holding ranks
    assert (got["dense_dims"], got["dense_shard"], got["dense_size"]) == (
        ["dp_shard_cp"],
        "dp_shard_cp",
        4,
    )
    assert got["loss"] == [["dp_cp"], 4]
    # the cp ranks read the same batch: data is split over dp_shard only
    assert got["data"] == [["dp_shard"], 2] and got["dp_rank"] == 0 and got["cp_rank"] == 0
    # CP's own group: the same ranks as the mesh's cp dim, another object, not one of FSDP's
    assert got["cp_ranks"] == got["mesh_cp_ranks"] == [0, 2]
    assert got["cp_is_mesh_cp"] is False and got["cp_in_fsdp"] is False
    assert got["n_fsdp"] == 1 and got["cp_named"] == "cp"


def test_mesh_cp_group_of_another_rank(meshes):
    # rank 5 = (dp_shard 1, cp 0, tp 1): its cp peer is rank 7
    got = meshes["cp2_tp2_rank5"]
    assert got["cp_ranks"] == got["mesh_cp_ranks"] == [5, 7]
    assert (got["dp_rank"], got["cp_rank"]) == (1, 0)
    assert got["cp_is_mesh_cp"] is False and got["cp_in_fsdp"] is False


def test_mesh_cp_without_dp_shard_keeps_its_own_group(meshes):
    # dp_shard 1 x cp 2: flattening gives back the mesh's cp group, which FSDP then uses
    got = meshes["cp_only"]
    assert got["shape"] == {"dp_shard": 1, "cp": 2}
    assert (
        got["dense_size"] == 2
        and got["loss"] == [["dp_cp"], 2]
        and got["data"] == [["dp_shard"], 1]
    )
    assert got["cp_ranks"] == got["mesh_cp_ranks"] == [0, 1]
    assert got["cp_is_mesh_cp"] is False and got["cp_in_fsdp"] is False and got["cp_named"] == "cp"


def test_mesh_hsdp_with_cp(meshes):
    got = meshes["hsdp_cp"]
    assert got["shape"] == {"dp_replicate": 2, "dp_shard": 2, "cp": 2}
    assert got["dense_dims"] == ["dp_replicate", "dp_shard_cp"] and got["dense_size"] == 4
    assert got["loss"] == [["dp_cp"], 8] and got["data"] == [["dp"], 4]
    assert got["cp_ranks"] == [0, 1] and got["cp_in_fsdp"] is False and got["n_fsdp"] == 2


def test_mesh_ep_takes_all_of_cp_then_dp_shard(meshes):
    # 8 ranks, dp_shard 4 x cp 2, EP 4 = 2 of dp_shard x both cp ranks; experts' FSDP over the other 2
    got = meshes["ep4_cp2"]
    assert got["shape"] == {"dp_shard_mod_ep": 2, "dp_shard_in_ep": 2, "cp": 2}
    assert got["ep_ranks"] == [0, 1, 2, 3] and got["experts"] == [[2], 8]
    assert (
        got["dense_dims"] == ["dp_shard_cp"]
        and got["dense_size"] == 8
        and got["loss"] == [["dp_cp"], 8]
    )
    assert got["cp_ranks"] == [0, 1] and got["cp_in_fsdp"] is False
