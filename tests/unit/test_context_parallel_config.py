"""Context parallel in the config check and the job's degrees: one-line ConfigErrors for
seq_len, TP, EP and world size; dp_shard x cp for FSDP and the loss. (The mesh, with CP's own
K/V group apart from FSDP's, on a fake process group in a child process:
tests/integration/test_context_parallel_mesh.py.)"""

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
    assert (
        warnings == []
        and cfg.parallelism.context_parallel_degree == 4
        and cfg.training.seq_len == 248
    )


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
    assert (cfg.parallelism.context_parallel_degree, cfg.parallelism.tensor_parallel_degree) == (
        2,
        4,
    )


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
    assert config_error(
        [f"{CP}=2", f"{TP}=2", "--parallelism.data_parallel_shard_degree=4"], world_size=8
    ) == (
        "parallel degrees multiply to 16 (replicate 1 x shard 4 x cp 2 x tp 2 x pp 1) but the world size is 8;"
        " make them multiply to 8 or set --parallelism.data_parallel_shard_degree=auto"
    )
    assert config_error([f"{CP}=0"], world_size=8) == f"{CP}=0: must be >= 1"


def test_attn_mask_values():
    for mask in ("causal", "block_causal"):
        cfg, warnings = load_config([f"--model.attn_mask={mask}", f"{CP}=2"], 8)
        assert warnings == [] and cfg.model.attn_mask == mask
    assert cfg_of([]).model.attn_mask == "auto"  # the default: the flavor's (causal here)
    for bad in ("blockcausal", "sliding", "Causal"):
        assert config_error([f"--model.attn_mask={bad}"]).startswith(
            f"--model.attn_mask: invalid value '{bad}'; choose one of 'auto', 'causal', 'block_causal'"
        )


# --------------------------------------------------------------------------- the degrees


def test_degrees_with_cp():
    d = degrees(cfg_of([f"{CP}=2"]), 8)
    assert (d.dp_replicate, d.dp_shard, d.cp, d.tp, d.pp) == (1, 4, 2, 1, 1)
    assert (d.dp, d.dp_cp, d.fsdp_shard) == (4, 8, 8)
    d = degrees(
        cfg_of([f"{CP}=2", "--parallelism.data_parallel_replicate_degree=2", f"{TP}=2"]), 16
    )
    assert (d.dp_shard, d.dp, d.dp_cp, d.fsdp_shard) == (2, 4, 8, 4)
    assert degrees(cfg_of([]), 8).cp == 1 and degrees(cfg_of([]), 8).dp_cp == 8


def test_ep_from_dp_shard_leaves_out_cp_and_tp():
    assert degrees(cfg_of(DSV3 + [f"{EP}=4", f"{CP}=2"]), 8).ep_from_dp_shard == 2
    assert degrees(cfg_of(DSV3 + [f"{EP}=8", f"{CP}=2", f"{TP}=2"]), 16).ep_from_dp_shard == 2
    assert degrees(cfg_of(DSV3 + [f"{EP}=2", f"{CP}=2"]), 8).ep_from_dp_shard == 1
    assert degrees(cfg_of(DSV3 + [f"{CP}=2"]), 8).ep_from_dp_shard == 1  # no EP
