"""The parity cases (parity_cases.py) under pytest: each case's losses vs the 1-rank reference, and
numerics-neutral features (activation checkpointing) bitwise identical to running without.
(The runs, once per session: references.py.)"""

import parity_cases
import pytest
import references as refs
import run_tests

FAST = [c for c in parity_cases.CASES if not c.slow]
SLOW = [c for c in parity_cases.CASES if c.slow]


def _check(case, tmp_path_factory):
    ref_name = parity_cases.reference_name(case.model, case.dtype, case.attn_mask)
    reference = refs.losses(ref_name, tmp_path_factory)
    losses = refs.losses(case.name, tmp_path_factory)
    assert len(losses) == parity_cases.STEPS
    assert run_tests.max_rel_diff(losses, reference) <= run_tests.tolerance(case), (
        losses,
        reference,
    )
    norms, ref_norms = refs.GRAD_NORMS[case.name], refs.GRAD_NORMS[ref_name]
    assert run_tests.max_rel_diff(norms, ref_norms) <= run_tests.tolerance(case), (norms, ref_norms)
    if case.model != "llama3":  # the same routing and bias updates in every layout
        assert refs.LOADS[case.name] == refs.LOADS[ref_name], (
            refs.LOADS[case.name],
            refs.LOADS[ref_name],
        )


@pytest.mark.parametrize("case", FAST, ids=[c.name for c in FAST])
def test_case_matches_one_rank(case, tmp_path_factory):
    _check(case, tmp_path_factory)


@pytest.mark.slow
@pytest.mark.parametrize("case", SLOW, ids=[c.name for c in SLOW])
def test_slow_case_matches_one_rank(case, tmp_path_factory):
    _check(case, tmp_path_factory)


def test_reference_loss_decreases(tmp_path_factory):
    reference = refs.losses("reference", tmp_path_factory)
    assert reference[-1] < reference[0] - 0.1, reference


@pytest.mark.parametrize("ac_case", ["fsdp_ac_full", "fsdp_ac_op", "fsdp_ac_layer"])
def test_activation_checkpointing_is_bitwise_neutral(ac_case, tmp_path_factory):
    # Same layout (2 ranks, FSDP), recompute instead of keeping activations: same math. (fsdp_2
    # runs through run_train.sh, the AC cases through the fast launcher: the launchers agree too.)
    assert refs.losses(ac_case, tmp_path_factory) == refs.losses("fsdp_2", tmp_path_factory)


def test_compile_matches_eager(tmp_path_factory):
    # Inductor may fuse and reorder reductions, so bitwise equality is not promised; on the
    # CPUs here it has been exact, and it must stay within fp32 noise.
    compiled = refs.losses("fsdp_compile", tmp_path_factory)
    eager = refs.losses("fsdp_2", tmp_path_factory)
    assert run_tests.max_rel_diff(compiled, eager) <= 1e-5, (compiled, eager)


@pytest.mark.parametrize("ac_case", ["deepseek_ep_ac_full", "deepseek_ep_ac_op"])
def test_activation_checkpointing_with_expert_parallel_is_bitwise_neutral(
    ac_case, tmp_path_factory
):
    # Recompute must route exactly as forward did (same splits, same experts, counts not
    # doubled): the losses are bitwise those of the same EP layout without AC.
    assert refs.losses(ac_case, tmp_path_factory) == refs.losses(
        "deepseek_ep_all_of_dp_shard", tmp_path_factory
    )


@pytest.mark.parametrize(
    "ac_case, backward_a2a",
    [("deepseek_ep_all_of_dp_shard", 12), ("deepseek_ep_ac_op", 12), ("deepseek_ep_ac_full", 30)],
)
def test_expert_parallel_all_to_alls_per_step(ac_case, backward_a2a, tmp_path_factory):
    # 3 MoE layers x 2 accumulation steps. Forward: counts, dispatch, combine = 3 all-to-alls per
    # layer. Backward: the reverse of dispatch and combine = 2; op SAC keeps the dispatched
    # tokens so recompute sends nothing; full AC sends the forward's 3 again.
    comm = refs.comm(ac_case, tmp_path_factory)
    assert comm["forward/all_to_all/ep"] == 3 * 3 * 2
    assert comm["backward/all_to_all/ep"] == backward_a2a
    assert not any("all_to_all" in key and not key.endswith("/ep") for key in comm), comm


def test_simple_fsdp_with_expert_parallel_gathers_nothing_in_backward(tmp_path_factory):
    # reshard never + fsdp_ac_policy auto + op SAC: the gathers of the dense units (dp_shard)
    # and of the experts (dp_shard_mod_ep, what EP left) are saved, never redone.
    comm = refs.comm("deepseek_simple_fsdp+ep_op_sac", tmp_path_factory)
    assert (
        comm["forward/all_gather/dp_shard"] > 0 and comm["forward/all_gather/dp_shard_mod_ep"] > 0
    ), comm
    assert not [key for key in comm if key.startswith("backward/all_gather")], comm
    assert (
        comm["backward/reduce_scatter/dp_shard_mod_ep"]
        == comm["forward/all_gather/dp_shard_mod_ep"]
    )
    assert comm["backward/all_to_all/ep"] == 3 * 2  # 3 MoE layers, 1 accumulation step


@pytest.mark.parametrize("case", ["qwen3_moe_ep", "qwen3_moe_pp+ep"])
def test_qwen3_switch_balance_loss_equals_one_rank(case, tmp_path_factory):
    # Qwen's loss spans every MoE layer of the micro-batch: under PP the routing statistics
    # travel with the hidden states to the last stage, and the logged value (the last stage's)
    # is the 1-rank one at every step. Without the loss the losses would differ by ~5e-5.
    refs.losses(case, tmp_path_factory)
    refs.losses("reference_qwen3_moe", tmp_path_factory)
    ours, reference = refs.AUX[case], refs.AUX["reference_qwen3_moe"]
    assert len(ours) == parity_cases.STEPS and all(a > 0 for a in ours), ours
    assert run_tests.max_rel_diff(ours, reference) <= 1e-5, (ours, reference)


def test_float8_activation_checkpointing_is_bitwise_neutral(tmp_path_factory):
    # op SAC keeps the float8 GEMMs' outputs and amaxes and recomputes the casts, which gives
    # the same float8 operands: the same figures, bit for bit
    assert refs.losses("float8_fsdp_ac_op", tmp_path_factory) == refs.losses(
        "float8_fsdp", tmp_path_factory
    )
    assert refs.GRAD_NORMS["float8_fsdp_ac_op"] == refs.GRAD_NORMS["float8_fsdp"]


def test_float8_compiled_matches_eager(tmp_path_factory):
    # aot_eager (graph capture, AOTAutograd, the partitioner; no inductor codegen) over
    # torchao's float8 linears and FSDP2's float8 all-gather: the eager run's figures
    compiled = refs.losses("float8_fsdp_all_gather_compiled", tmp_path_factory)
    eager = refs.losses("float8_fsdp_all_gather", tmp_path_factory)
    assert run_tests.max_rel_diff(compiled, eager) <= 1e-6, (compiled, eager)
