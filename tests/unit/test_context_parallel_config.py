"""Context parallel in the config check, the job's degrees and the mesh: one-line ConfigErrors
for seq_len, TP, EP and world size; dp_shard x cp for FSDP and the loss; CP's own K/V group
apart from FSDP's (the mesh on a fake process group, in a child process)."""

import json
import subprocess
import sys

import pytest
from config_helpers import cfg_of, config_error

from torchtitan.checks import load_config
from torchtitan.distributed.job_shape import degrees

CP = "--parallelism.context_parallel_degree"
TP = "--parallelism.tensor_parallel_degree"
EP = "--parallelism.expert_parallel_degree"
DSV3 = ["--model.name=deepseek_v3", "--model.flavor=tiny"]


# --------------------------------------------------------------------------- the config check


@pytest.mark.parametrize("cp, seq_len", [(4, 252), (2, 255), (8, 8)])
def test_seq_len_must_split_into_two_chunks_per_cp_rank(cp, seq_len):
    assert config_error([f"{CP}={cp}", f"--training.seq_len={seq_len}"], world_size=8) == (
        f"{CP}={cp} cuts each sequence into 2 x {cp} chunks but --training.seq_len={seq_len} is not a"
        f" multiple of {2 * cp}; pick a seq_len that is"
    )


def test_seq_len_multiple_of_two_cp_is_accepted():
    cfg, warnings = load_config([f"{CP}=4", "--training.seq_len=248"], 8)
    assert warnings == [] and cfg.parallelism.context_parallel_degree == 4 and cfg.training.seq_len == 248


def test_a_cp_rank_tokens_must_split_over_tp():
    # 36 / CP 2 = 18 tokens per CP rank, not a multiple of TP 4; lcm(2 x 2, 2 x 4) = 8
    assert config_error([f"{CP}=2", f"{TP}=4", "--training.seq_len=36"], world_size=8) == (
        f"--training.seq_len=36: a CP rank's 18 tokens do not split over {TP}=4 (sequence parallel);"
        " pick a seq_len that is a multiple of 8"
    )
    # 20 / CP 2 = 10 tokens, TP 8: lcm(2 x 2, 2 x 8) = 16
    assert config_error([f"{CP}=2", f"{TP}=8", "--training.seq_len=20"], world_size=16) == (
        f"--training.seq_len=20: a CP rank's 10 tokens do not split over {TP}=8 (sequence parallel);"
        " pick a seq_len that is a multiple of 16"
    )
    cfg, _ = load_config([f"{CP}=2", f"{TP}=4", "--training.seq_len=40"], 8)
    assert (cfg.parallelism.context_parallel_degree, cfg.parallelism.tensor_parallel_degree) == (2, 4)


@pytest.mark.parametrize("cp, tp, ep", [(2, 2, 2), (4, 1, 2), (2, 1, 3)])
def test_deepseek_ep_must_take_all_of_tp_and_cp(cp, tp, ep):
    argv = DSV3 + [f"{CP}={cp}", f"{TP}={tp}", f"{EP}={ep}", "--training.seq_len=64"]
    assert config_error(argv, world_size=8) == (
        f"{EP}={ep} with {CP}={cp} must be a multiple of tensor_parallel_degree x"
        f" context_parallel_degree = {tp * cp}: every CP rank routes its own tokens, so EP takes all of CP"
    )


def test_deepseek_ep_beyond_cp_takes_ranks_from_dp_shard():
    # 8 ranks, CP 2: dp_shard 4; EP 16 would take 8 of them
    assert config_error(DSV3 + [f"{CP}=2", f"{EP}=16", "--training.seq_len=64"], world_size=8) == (
        f"{EP}=16 takes 8 ranks from data_parallel_shard_degree=4 (ep / (tp x cp)), which does not divide it;"
        " pick an expert_parallel_degree of tp x cp x a divisor of 4"
    )
    for argv in ([f"{CP}=2", f"{EP}=4"], [f"{CP}=2", f"{TP}=2", f"{EP}=4"], [f"{CP}=2", f"{EP}=8"]):
        cfg, warnings = load_config(DSV3 + argv + ["--training.seq_len=64"], 8)
        assert warnings == [] and cfg.parallelism.context_parallel_degree == 2


def test_cp_times_the_other_degrees_must_make_the_world_size():
    assert config_error([f"{CP}=3"], world_size=8) == (
        "world size 8 is not divisible by data_parallel_replicate_degree x tensor_parallel_degree x"
        " pipeline_parallel_degree x context_parallel_degree = 3; change the degrees or NGPU"
    )
    assert config_error([f"{CP}=2", f"{TP}=2", "--parallelism.data_parallel_shard_degree=4"], world_size=8) == (
        "parallel degrees multiply to 16 (replicate 1 x shard 4 x cp 2 x tp 2 x pp 1) but the world size is 8;"
        " make them multiply to 8 or set --parallelism.data_parallel_shard_degree=auto"
    )
    assert config_error([f"{CP}=0"], world_size=8) == f"{CP}=0: must be >= 1"


def test_attn_mask_values():
    for mask in ("causal", "block_causal"):
        cfg, warnings = load_config([f"--model.attn_mask={mask}", f"{CP}=2"], 8)
        assert warnings == [] and cfg.model.attn_mask == mask
    assert cfg_of([]).model.attn_mask == "causal"  # the default
    for bad in ("blockcausal", "sliding", "Causal"):
        assert config_error([f"--model.attn_mask={bad}"]) == f"--model.attn_mask={bad}: choose causal or block_causal"


# --------------------------------------------------------------------------- the degrees


def test_degrees_with_cp():
    d = degrees(cfg_of([f"{CP}=2"]), 8)
    assert (d.dp_replicate, d.dp_shard, d.cp, d.tp, d.pp) == (1, 4, 2, 1, 1)
    assert (d.dp, d.dp_cp, d.fsdp_shard) == (4, 8, 8)
    d = degrees(cfg_of([f"{CP}=2", "--parallelism.data_parallel_replicate_degree=2", f"{TP}=2"]), 16)
    assert (d.dp_shard, d.dp, d.dp_cp, d.fsdp_shard) == (2, 4, 8, 4)
    assert degrees(cfg_of([]), 8).cp == 1 and degrees(cfg_of([]), 8).dp_cp == 8


def test_ep_from_dp_shard_leaves_out_cp_and_tp():
    assert degrees(cfg_of(DSV3 + [f"{EP}=4", f"{CP}=2"]), 8).ep_from_dp_shard == 2
    assert degrees(cfg_of(DSV3 + [f"{EP}=8", f"{CP}=2", f"{TP}=2"]), 16).ep_from_dp_shard == 2
    assert degrees(cfg_of(DSV3 + [f"{EP}=2", f"{CP}=2"]), 8).ep_from_dp_shard == 1
    assert degrees(cfg_of(DSV3 + [f"{CP}=2"]), 8).ep_from_dp_shard == 1  # no EP


# --------------------------------------------------------------------------- the mesh (fake process group)

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
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=subprocess_env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_mesh_dp_shard_cp_tp(meshes):
    got = meshes["cp2_tp2"]
    assert got["shape"] == {"dp_shard": 2, "cp": 2, "tp": 2}
    # dense FSDP shards over dp_shard x cp; losses average over the same 4 token-holding ranks
    assert (got["dense_dims"], got["dense_shard"], got["dense_size"]) == (["dp_shard_cp"], "dp_shard_cp", 4)
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
    assert got["dense_size"] == 2 and got["loss"] == [["dp_cp"], 2] and got["data"] == [["dp_shard"], 1]
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
    assert got["dense_dims"] == ["dp_shard_cp"] and got["dense_size"] == 8 and got["loss"] == [["dp_cp"], 8]
    assert got["cp_ranks"] == [0, 1] and got["cp_in_fsdp"] is False
