"""reshard_policy.resolve: the per-unit reshard_after_forward plan (auto / always / never,
pipeline facts), kept_bytes, and the FSDP units of the real Llama3 models. With a memory
budget: test_reshard_budget.py."""

import pytest
import torch
from reshard_cases import (
    ALL_SCHEDULES,
    ALWAYS,
    FREED,
    LAST,
    NEVER,
    NOTE,
    OTHER_SCHEDULES,
    ROOT,
    ZERO_BUBBLE,
    budget_freed,
    flags,
    pp_kept,
    reasons,
    whole_model,
)

from torchtitan.distributed.data_parallel import size_units
from torchtitan.distributed.pipeline_layout import plan_pipeline
from torchtitan.distributed.pipeline_parallel import split_model
from torchtitan.distributed.plan import FsdpUnit, UnitKind
from torchtitan.distributed.reshard_policy import (
    POLICIES,
    Decision,
    ReshardPolicyError,
    kept_bytes,
    resolve,
)
from torchtitan.models.flavors import model_args
from torchtitan.models.llama3.model import Transformer
from torchtitan.units import GIB


def fsdp_units(model, tp: int, dtype_bytes: int) -> list[FsdpUnit]:
    """Llama3's units: the shared sizing with nothing model-specific."""
    return size_units(model, tp, 1, dtype_bytes)


# --------------------------------------------------------------------------- policy names


def test_policies_and_error_type():
    assert POLICIES == ("auto", "always", "never")
    assert issubclass(ReshardPolicyError, ValueError)
    assert GIB == 1024**3


@pytest.mark.parametrize("policy", ["", "Auto", "default", "ALWAYS", "none"])
def test_invalid_policy_names_the_key(policy):
    with pytest.raises(ReshardPolicyError) as info:
        resolve(policy, False, "1F1B", 1, [whole_model()])
    assert str(info.value) == (
        f"--parallelism.reshard_after_forward={policy!r}: choose one of auto, always, never"
    )


def test_invalid_policy_is_reported_before_the_zero_bubble_check():
    with pytest.raises(ReshardPolicyError) as info:
        resolve(
            "sometimes", True, "ZBVZeroBubble", 4, [whole_model()], free_bytes=1, budget_note=NOTE
        )
    assert str(info.value) == (
        "--parallelism.reshard_after_forward='sometimes': choose one of auto, always, never"
    )


# --------------------------------------------------------------------------- always


@pytest.mark.parametrize(
    "pp_enabled,schedule",
    [(False, s) for s in ALL_SCHEDULES] + [(True, s) for s in OTHER_SCHEDULES],
)
def test_always_reshards_every_unit_but_the_root(pp_enabled, schedule):
    plan = resolve("always", pp_enabled, schedule, 8, [whole_model()])
    assert plan == [
        {
            "tok_embeddings": Decision(True, ALWAYS),
            "layers.0": Decision(True, ALWAYS),
            "layers.1": Decision(True, ALWAYS),
            "layers.2": Decision(True, ALWAYS),
            "": Decision(False, ROOT),
        }
    ]


@pytest.mark.parametrize("schedule", ZERO_BUBBLE)
def test_always_with_a_zero_bubble_schedule_under_pp_is_rejected(schedule):
    with pytest.raises(ReshardPolicyError) as info:
        resolve("always", True, schedule, 8, [whole_model()])
    # the config check raises these words too (one rule, reshard_policy.check_policy)
    assert str(info.value) == (
        f"--parallelism.reshard_after_forward=always with --parallelism.pipeline_parallel_schedule={schedule}:"
        " zero-bubble schedules give wrong gradients when FSDP2 reshards after forward (torch 2.13);"
        " use auto or never, or a non-zero-bubble schedule"
    )


def test_always_ignores_free_bytes():
    plan = resolve("always", False, "1F1B", 1, [whole_model()], free_bytes=GIB, budget_note=NOTE)
    assert reasons(plan) == [
        {
            "tok_embeddings": ALWAYS,
            "layers.0": ALWAYS,
            "layers.1": ALWAYS,
            "layers.2": ALWAYS,
            "": ROOT,
        }
    ]


# --------------------------------------------------------------------------- never


@pytest.mark.parametrize(
    "pp_enabled,schedule",
    [(False, "1F1B"), (True, "1F1B"), (True, "ZBVZeroBubble"), (True, "DualPipeV")],
)
def test_never_keeps_every_unit_root_included(pp_enabled, schedule):
    parts = [whole_model(), [FsdpUnit("layers.7", GIB), FsdpUnit("", GIB)]]
    plan = resolve(
        "never", pp_enabled, schedule, 4, parts, free_bytes=GIB, budget_note=NOTE
    )  # ignored, no raise
    assert plan == [
        {
            name: Decision(False, NEVER)
            for name in ["tok_embeddings", "layers.0", "layers.1", "layers.2", ""]
        },
        {"layers.7": Decision(False, NEVER), "": Decision(False, NEVER)},
    ]
    assert kept_bytes(plan, parts) == 7 * GIB


# --------------------------------------------------------------------------- auto without PP


def test_auto_without_pp_keeps_only_the_last_block_and_the_root():
    plan = resolve("auto", False, "1F1B", 1, [whole_model(block_gib=(1, 2, 3, 4))])
    assert plan == [
        {
            "tok_embeddings": Decision(True, FREED),
            "layers.0": Decision(True, FREED),
            "layers.1": Decision(True, FREED),
            "layers.2": Decision(True, FREED),
            "layers.3": Decision(False, LAST),
            "": Decision(False, ROOT),
        }
    ]


def test_auto_plan_keeps_the_forward_order_of_the_units():
    units = whole_model(block_gib=(1,) * 12)
    plan = resolve("auto", False, "1F1B", 1, [units])
    assert list(plan[0]) == [u.name for u in units]
    assert [name for name, d in plan[0].items() if not d.reshard] == ["layers.11", ""]


def test_auto_last_block_is_the_last_non_root_unit_even_when_the_root_is_not_last():
    units = [FsdpUnit("", GIB), FsdpUnit("layers.0", GIB), FsdpUnit("layers.1", GIB)]
    plan = resolve("auto", False, "1F1B", 1, [units])
    assert plan == [
        {
            "": Decision(False, ROOT),
            "layers.0": Decision(True, FREED),
            "layers.1": Decision(False, LAST),
        }
    ]


def test_auto_single_root_unit():
    parts = [[FsdpUnit("", 5 * GIB)]]
    plan = resolve("auto", False, "1F1B", 1, parts)
    assert plan == [{"": Decision(False, ROOT)}]
    assert kept_bytes(plan, parts) == 5 * GIB


def test_auto_embeddings_alone_before_the_root_are_the_last_block():
    plan = resolve("auto", False, "1F1B", 1, [[FsdpUnit("tok_embeddings", 1), FsdpUnit("", 1)]])
    assert plan == [{"tok_embeddings": Decision(False, LAST), "": Decision(False, ROOT)}]


def test_auto_with_a_zero_bubble_schedule_name_but_no_pp_is_the_plain_plan():
    plan = resolve("auto", False, "ZBVZeroBubble", 1, [whole_model()])
    assert flags(plan) == [
        {"tok_embeddings": True, "layers.0": True, "layers.1": True, "layers.2": False, "": False}
    ]


# --------------------------------------------------------------------------- auto under PP


@pytest.mark.parametrize("schedule", ALL_SCHEDULES)
@pytest.mark.parametrize("n_microbatches", [2, 8, 32])
def test_auto_under_pp_keeps_everything(schedule, n_microbatches):
    parts = [
        [FsdpUnit("tok_embeddings", GIB), FsdpUnit("layers.0", GIB), FsdpUnit("layers.1", GIB)],
        [FsdpUnit("layers.4", GIB), FsdpUnit("layers.5", GIB), FsdpUnit("", GIB)],
    ]
    plan = resolve("auto", True, schedule, n_microbatches, parts)
    kept = pp_kept(n_microbatches)
    assert plan == [
        {
            "tok_embeddings": Decision(False, kept),
            "layers.0": Decision(False, kept),
            "layers.1": Decision(False, kept),
        },
        {
            "layers.4": Decision(False, kept),
            "layers.5": Decision(False, kept),
            "": Decision(False, ROOT),
        },
    ]
    assert f"instead of {n_microbatches}" in plan[0]["layers.0"].reason
    assert kept_bytes(plan, parts) == 6 * GIB


def test_resolve_returns_one_dict_per_part_even_for_empty_parts():
    assert resolve("auto", True, "1F1B", 4, []) == []
    assert resolve("auto", True, "Interleaved1F1B", 4, [[], [FsdpUnit("layers.0", 1)]]) == [
        {},
        {"layers.0": Decision(False, pp_kept(4))},
    ]


# --------------------------------------------------------------------------- kept_bytes


def test_kept_bytes_sums_only_kept_units_over_all_parts():
    parts = [[FsdpUnit("a", 3), FsdpUnit("b", 5)], [FsdpUnit("c", 7), FsdpUnit("", 11)]]
    plan = [
        {"a": Decision(True, "x"), "b": Decision(False, "y")},
        {"c": Decision(False, "z"), "": Decision(False, "w")},
    ]
    assert kept_bytes(plan, parts) == 5 + 7 + 11
    assert kept_bytes([{"a": Decision(True, ""), "b": Decision(True, "")}], [parts[0]]) == 0
    assert kept_bytes([], []) == 0


def test_kept_bytes_of_resolved_plans():
    parts = [whole_model(block_gib=(1, 2, 4), emb_gib=8, root_gib=16)]
    assert kept_bytes(resolve("never", False, "1F1B", 1, parts), parts) == 31 * GIB
    assert kept_bytes(resolve("always", False, "1F1B", 1, parts), parts) == 16 * GIB
    assert kept_bytes(resolve("auto", False, "1F1B", 1, parts), parts) == 20 * GIB


# --------------------------------------------------------------------------- the real Llama3 units


VOCAB, SEQ = 2048, 64


def meta_model(flavor: str) -> Transformer:
    with torch.device("meta"):
        return Transformer(model_args("llama3", flavor, VOCAB, SEQ))


def block_params(a) -> tuple[int, int]:
    """(matrix elements, norm-vector elements) of one block, in closed form."""
    attn = 2 * a.dim * a.n_heads * a.head_dim + 2 * a.dim * a.n_kv_heads * a.head_dim
    return attn + 3 * a.dim * a.ffn_hidden_dim, 2 * a.dim


@pytest.mark.parametrize("flavor,n_layers", [("tiny", 4), ("debugmodel", 6)])
def test_fsdp_units_of_the_whole_model(flavor, n_layers):
    model = meta_model(flavor)
    a = model.args
    units = fsdp_units(model, tp=1, dtype_bytes=4)
    names = ["tok_embeddings"] + [f"layers.{i}" for i in range(n_layers)] + [""]
    assert [u.name for u in units] == names
    assert [u.is_root for u in units] == [False] * (n_layers + 1) + [True]
    assert [u.block for u in units] == [None] + names[1:-1] + [None]
    assert {u.kind for u in units} == {UnitKind.DENSE}
    matrices, norms = block_params(a)
    assert units[0].param_bytes == 4 * VOCAB * a.dim
    assert all(u.param_bytes == 4 * (matrices + norms) for u in units[1:-1])
    assert units[-1].param_bytes == 4 * (VOCAB * a.dim + a.dim)  # output + final norm
    total = sum(p.numel() for p in model.parameters())
    assert sum(u.param_bytes for u in units) == 4 * total


@pytest.mark.parametrize("flavor", ["tiny", "debugmodel"])
def test_fsdp_units_with_tp_halve_matrices_but_not_norms(flavor):
    model = meta_model(flavor)
    a = model.args
    one, two = fsdp_units(model, tp=1, dtype_bytes=4), fsdp_units(model, tp=2, dtype_bytes=4)
    assert [u.name for u in two] == [u.name for u in one]
    expected = {u.name: 0 for u in two}
    for name, p in model.named_parameters():
        unit = (
            "tok_embeddings"
            if name.startswith("tok_embeddings")
            else (".".join(name.split(".")[:2]) if name.startswith("layers.") else "")
        )
        expected[unit] += 4 * (p.numel() // 2 if p.dim() >= 2 else p.numel())
    assert {u.name: u.param_bytes for u in two} == expected
    matrices, norms = block_params(a)
    assert two[1].param_bytes == 4 * (matrices // 2 + norms)
    assert two[-1].param_bytes == 4 * (VOCAB * a.dim // 2 + a.dim)
    # Only the matrix bytes halve: the norm vectors (two per block + the final one) stay.
    norm_bytes = 4 * (len(model.layers) * norms + a.dim)
    total_one, total_two = sum(u.param_bytes for u in one), sum(u.param_bytes for u in two)
    assert total_two == (total_one - norm_bytes) // 2 + norm_bytes


def test_fsdp_units_dtype_bytes_scale_every_unit():
    model = meta_model("tiny")
    fp32 = fsdp_units(model, tp=1, dtype_bytes=4)
    bf16 = fsdp_units(model, tp=1, dtype_bytes=2)
    assert [(u.name, 2 * u.param_bytes) for u in bf16] == [(u.name, u.param_bytes) for u in fp32]


def test_fsdp_units_of_pipeline_stages_and_their_plan():
    model = meta_model("debugmodel")
    layout = plan_pipeline(6, 2, "1F1B", "auto", [], n_microbatches=8)
    units = {}
    for pp_rank in range(2):
        ((stage_id, part),) = split_model(model, layout, pp_rank)
        units[stage_id] = fsdp_units(part, tp=1, dtype_bytes=4)
    # The first stage has no root unit (nothing is left for it); the last one holds norm + output.
    assert [u.name for u in units[0]] == ["tok_embeddings", "layers.0", "layers.1", "layers.2"]
    assert [u.name for u in units[1]] == ["layers.3", "layers.4", "layers.5", ""]
    whole = {u.name: u.param_bytes for u in fsdp_units(model, tp=1, dtype_bytes=4)}
    for stage in units.values():
        assert all(u.param_bytes == whole[u.name] for u in stage)
    plan = resolve("auto", True, "1F1B", 8, [units[1]])
    assert flags(plan) == [{"layers.3": False, "layers.4": False, "layers.5": False, "": False}]


def test_auto_plan_of_the_debug_model_without_pp_and_with_a_budget():
    model = meta_model("debugmodel")
    parts = [fsdp_units(model, tp=1, dtype_bytes=4)]
    plan = resolve("auto", False, "1F1B", 1, parts)
    assert [n for n, d in plan[0].items() if not d.reshard] == ["layers.5", ""]
    sizes = {u.name: u.param_bytes for u in parts[0]}
    assert kept_bytes(plan, parts) == sizes["layers.5"] + sizes[""]
    # Freeing exactly the last block's bytes frees the last block: only the root is left kept.
    plan = resolve("auto", False, "1F1B", 1, parts, free_bytes=sizes["layers.5"], budget_note=NOTE)
    assert [n for n, d in plan[0].items() if not d.reshard] == [""]
    assert plan[0]["layers.5"] == Decision(True, budget_freed())
    assert kept_bytes(plan, parts) == sizes[""]
    # Under PP (one stage holding everything) the earliest units go first: the embeddings are
    # larger than the 1 byte asked, so nothing else is freed.
    plan = resolve("auto", True, "1F1B", 4, parts, free_bytes=1, budget_note=NOTE)
    assert [n for n, d in plan[0].items() if d.reshard] == ["tok_embeddings"]
