"""ParallelDims: the one mesh, with expert parallel built in. Checked in a child process on a
fake process group of 16 ranks (rank 0's view), so no real group is created here."""

import json
import subprocess
import sys

SCRIPT = r"""
import json, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from torchtitan.distributed.parallel_dims import ParallelDims
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=16)
out = {}
for name, (r, s, t, e) in {"ep4_tp2": (1, 8, 2, 4), "hsdp_ep4_tp2": (2, 4, 2, 4), "ep_all": (1, 16, 1, 16),
                           "no_ep": (2, 4, 2, 1)}.items():
    d = ParallelDims(r, s, t, 16 // (r * s * t), e, 16)
    d.build_mesh("cpu")
    sub = {n: list(d.submesh(n).shape) if d.submesh(n) is not None else None
           for n in ("dp", "fsdp", "ep", "experts_fsdp", "tp", "pp")}
    out[name] = {"shape": d.mesh_shape, "sub": sub, "dp_shard": d.mesh["dp_shard"].size(),
                 "batch": d.batch_group().size()}
print(json.dumps(out))
"""


def test_expert_parallel_borrows_dp_shard_and_tp(subprocess_env):
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=subprocess_env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.splitlines()[-1])
    # 8 data-parallel x 2 TP, EP 4 = 2 of dp_shard x both TP ranks; experts' FSDP over the other 4.
    assert got["ep4_tp2"] == {
        "shape": {"dp_shard_mod_ep": 4, "dp_shard_in_ep": 2, "tp": 2},
        "sub": {"dp": [8], "fsdp": [8], "ep": [4], "experts_fsdp": [4], "tp": [2], "pp": None},
        "dp_shard": 8, "batch": 16,
    }
    assert got["hsdp_ep4_tp2"] == {
        "shape": {"dp_replicate": 2, "dp_shard_mod_ep": 2, "dp_shard_in_ep": 2, "tp": 2},
        "sub": {"dp": [8], "fsdp": [2, 4], "ep": [4], "experts_fsdp": [2, 2], "tp": [2], "pp": None},
        "dp_shard": 4, "batch": 16,
    }
    # EP = all of dp_shard: the experts' FSDP mesh has size 1.
    assert got["ep_all"]["shape"] == {"dp_shard_mod_ep": 1, "dp_shard_in_ep": 16}
    assert got["ep_all"]["sub"]["experts_fsdp"] == [1] and got["ep_all"]["sub"]["ep"] == [16]
    # Without EP the mesh is what it always was; the experts (if any) shard like the rest.
    assert got["no_ep"]["shape"] == {"dp_replicate": 2, "dp_shard": 4, "tp": 2}
    assert got["no_ep"]["sub"]["experts_fsdp"] == got["no_ep"]["sub"]["fsdp"] == [2, 4]
    assert got["no_ep"]["sub"]["ep"] is None
