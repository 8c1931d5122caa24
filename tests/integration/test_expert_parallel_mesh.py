"""ParallelDims: the one mesh, with expert parallel built in. Checked in a child process on a
fake process group of 16 ranks (rank 0's view), so no real group is created here. (Context
parallel's mesh: test_context_parallel_mesh.py.)"""

import json
import subprocess
import sys

SCRIPT = r"""
import json, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from torchtitan.distributed.parallel_dims import MeshDim, ParallelDims
from torchtitan.distributed.plan import UnitKind
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=16)
out = {}
for name, (r, s, t, e) in {"ep4_tp2": (1, 8, 2, 4), "hsdp_ep4_tp2": (2, 4, 2, 4), "ep_all": (1, 16, 1, 16),
                           "no_ep": (2, 4, 2, 1), "ddp": (2, 1, 1, 1)}.items():
    d = ParallelDims(r, s, t, 16 // (r * s * t), e, 16)
    d.build_mesh("cpu")
    dense, experts = d.dp_mesh(UnitKind.DENSE), d.dp_mesh(UnitKind.EXPERTS)
    sub = {"dp": list(d.loss_mesh().shape), "fsdp": list(dense.mesh.shape), "ep": d.ep_mesh() and list(d.ep_mesh().shape),
           "experts_fsdp": list(experts.mesh.shape), "tp": d.tp_mesh() and list(d.tp_mesh().shape),
           "pp": d.pp_group() and d.pp_group().size()}
    roles = {"dense": [x.value for x in dense.dims], "experts": [x.value for x in experts.dims],
             "experts_divide": experts.divide_factor, "dense_divide": dense.divide_factor}
    try:
        d.submesh(MeshDim.PP)
        missing = "no error"
    except KeyError as err:
        missing = str(err)
    try:
        d.submesh("tpp")
        typo = "no error"
    except ValueError as err:
        typo = str(err)
    out[name] = {"shape": d.mesh_shape, "sub": sub, "dp_shard": d.submesh(MeshDim.DP_SHARD).size(),
                 "batch": d.batch_group().size(), "roles": roles, "missing": missing, "typo": typo,
                 "fsdp_groups": len(d.fsdp_group_names())}
print(json.dumps(out))
"""


def test_expert_parallel_borrows_dp_shard_and_tp(subprocess_env):
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=subprocess_env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.splitlines()[-1])
    mesh = {
        name: {k: v[k] for k in ("shape", "sub", "dp_shard", "batch")} for name, v in got.items()
    }
    # 8 data-parallel x 2 TP, EP 4 = 2 of dp_shard x both TP ranks; experts' FSDP over the other 4.
    assert mesh["ep4_tp2"] == {
        "shape": {"dp_shard_mod_ep": 4, "dp_shard_in_ep": 2, "tp": 2},
        "sub": {"dp": [8], "fsdp": [8], "ep": [4], "experts_fsdp": [4], "tp": [2], "pp": None},
        "dp_shard": 8,
        "batch": 16,
    }
    assert mesh["hsdp_ep4_tp2"] == {
        "shape": {"dp_replicate": 2, "dp_shard_mod_ep": 2, "dp_shard_in_ep": 2, "tp": 2},
        "sub": {
            "dp": [8],
            "fsdp": [2, 4],
            "ep": [4],
            "experts_fsdp": [2, 2],
            "tp": [2],
            "pp": None,
        },
        "dp_shard": 4,
        "batch": 16,
    }
    # EP = all of dp_shard: the experts' FSDP mesh has size 1.
    assert got["ep_all"]["shape"] == {"dp_shard_mod_ep": 1, "dp_shard_in_ep": 16}
    assert got["ep_all"]["sub"]["experts_fsdp"] == [1] and got["ep_all"]["sub"]["ep"] == [16]
    # Without EP the mesh is what it always was; the experts (if any) shard like the rest.
    assert got["no_ep"]["shape"] == {"dp_replicate": 2, "dp_shard": 4, "tp": 2}
    assert got["no_ep"]["sub"]["experts_fsdp"] == got["no_ep"]["sub"]["fsdp"] == [2, 4]
    assert got["no_ep"]["sub"]["ep"] is None
    # Roles, not dim names: experts shard over what EP left, averaged over every dp rank.
    assert got["hsdp_ep4_tp2"]["roles"] == {
        "dense": ["dp_replicate", "dp_shard"],
        "experts": ["dp_replicate", "dp_shard_mod_ep"],
        "experts_divide": 8,
        "dense_divide": None,
    }
    assert got["no_ep"]["roles"] == {
        "dense": ["dp_replicate", "dp_shard"],
        "experts": ["dp_replicate", "dp_shard"],
        "experts_divide": None,
        "dense_divide": None,
    }
    assert got["ddp"]["roles"]["dense"] == got["ddp"]["roles"]["experts"] == ["dp_replicate"]
    assert got["ddp"]["sub"]["fsdp"] == [2]
    # FSDP's groups: dense (replicate, shard) + the experts' shard group under EP
    assert got["hsdp_ep4_tp2"]["fsdp_groups"] == 3 and got["no_ep"]["fsdp_groups"] == 2
    # Asking for a dimension the job does not have raises; a mistyped name too.
    assert got["ep4_tp2"]["missing"] == (
        "\"this job's mesh has no 'pp' dimension (mesh {'dp_shard_mod_ep': 4, 'dp_shard_in_ep': 2, 'tp': 2});"
        ' its degree is 1: check the degree before asking for it"'
    )
    assert got["ep4_tp2"]["typo"] == "'tpp' is not a valid MeshDim"
