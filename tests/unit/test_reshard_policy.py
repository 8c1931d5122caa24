"""reshard_policy.resolve: the per-unit reshard_after_forward plan (auto / always / never,
pipeline facts, the kept bytes the memory budget makes auto free), kept_bytes, and the FSDP
units of the real Llama3 models."""

import pytest
import torch

from torchtitan.distributed.pipeline_layout import plan_pipeline
from torchtitan.distributed.pipeline_parallel import split_model
from torchtitan.distributed.reshard_policy import (
    GIB,
    POLICIES,
    Decision,
    ReshardPolicyError,
    kept_bytes,
    resolve,
)
from torchtitan.models.llama3.model import Transformer
from torchtitan.distributed.data_parallel import size_units
from torchtitan.distributed.plan import FsdpUnit, UnitKind
from torchtitan.protocols.train_spec import model_args

MIB = 2**20


def fsdp_units(model, tp: int, dtype_bytes: int) -> list[FsdpUnit]:
    """Llama3's units: the shared sizing with nothing model-specific."""
    return size_units(model, tp, 1, dtype_bytes)

# The reasons resolve gives; asserted verbatim so that a change of wording is noticed.
NEVER = "never: kept for backward (ZeRO-2)"
ROOT = "root: backward starts here, FSDP would gather it again at once"
ALWAYS = "always: freed after forward (ZeRO-3)"
LAST = "auto: last in forward, its backward follows at once"
FREED = "auto: freed from its forward until its backward"


def pp_kept(n_microbatches: int) -> str:
    return f"auto, PP: kept, 1 gather per step instead of {n_microbatches} (one per microbatch)"


# The reason of a unit freed for the memory budget: the note (what the memory prediction
# says, torchtitan/memory/predict.py) is put in verbatim.
NOTE = "predicted peak 5.00 GiB > budget 4.00 GiB"


def budget_freed(note: str = NOTE) -> str:
    return f"auto, memory budget: {note}; freed (earliest first)"


ZERO_BUBBLE = ["InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"]
OTHER_SCHEDULES = ["GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS"]
ALL_SCHEDULES = OTHER_SCHEDULES + ZERO_BUBBLE


def whole_model(block_gib=(1, 1, 1), emb_gib=1, root_gib=1) -> list[FsdpUnit]:
    """One part without PP: embeddings, blocks, root, sizes in GiB."""
    units = [FsdpUnit("tok_embeddings", int(emb_gib * GIB))]
    units += [FsdpUnit(f"layers.{i}", int(g * GIB)) for i, g in enumerate(block_gib)]
    return units + [FsdpUnit("", int(root_gib * GIB))]


def flags(plan) -> list[dict[str, bool]]:
    return [{name: d.reshard for name, d in part.items()} for part in plan]


def reasons(plan) -> list[dict[str, str]]:
    return [{name: d.reason for name, d in part.items()} for part in plan]


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
        resolve("sometimes", True, "ZBVZeroBubble", 4, [whole_model()], free_bytes=1, budget_note=NOTE)
    assert str(info.value) == (
        "--parallelism.reshard_after_forward='sometimes': choose one of auto, always, never"
    )


# --------------------------------------------------------------------------- always


@pytest.mark.parametrize("pp_enabled,schedule", [(False, s) for s in ALL_SCHEDULES] + [(True, s) for s in OTHER_SCHEDULES])
def test_always_reshards_every_unit_but_the_root(pp_enabled, schedule):
    plan = resolve("always", pp_enabled, schedule, 8, [whole_model()])
    assert plan == [{
        "tok_embeddings": Decision(True, ALWAYS),
        "layers.0": Decision(True, ALWAYS),
        "layers.1": Decision(True, ALWAYS),
        "layers.2": Decision(True, ALWAYS),
        "": Decision(False, ROOT),
    }]


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
    assert reasons(plan) == [{
        "tok_embeddings": ALWAYS, "layers.0": ALWAYS, "layers.1": ALWAYS, "layers.2": ALWAYS, "": ROOT,
    }]


# --------------------------------------------------------------------------- never


@pytest.mark.parametrize("pp_enabled,schedule", [(False, "1F1B"), (True, "1F1B"), (True, "ZBVZeroBubble"), (True, "DualPipeV")])
def test_never_keeps_every_unit_root_included(pp_enabled, schedule):
    parts = [whole_model(), [FsdpUnit("layers.7", GIB), FsdpUnit("", GIB)]]
    plan = resolve("never", pp_enabled, schedule, 4, parts, free_bytes=GIB, budget_note=NOTE)  # ignored, no raise
    assert plan == [
        {name: Decision(False, NEVER) for name in ["tok_embeddings", "layers.0", "layers.1", "layers.2", ""]},
        {"layers.7": Decision(False, NEVER), "": Decision(False, NEVER)},
    ]
    assert kept_bytes(plan, parts) == 7 * GIB


# --------------------------------------------------------------------------- auto without PP


def test_auto_without_pp_keeps_only_the_last_block_and_the_root():
    plan = resolve("auto", False, "1F1B", 1, [whole_model(block_gib=(1, 2, 3, 4))])
    assert plan == [{
        "tok_embeddings": Decision(True, FREED),
        "layers.0": Decision(True, FREED),
        "layers.1": Decision(True, FREED),
        "layers.2": Decision(True, FREED),
        "layers.3": Decision(False, LAST),
        "": Decision(False, ROOT),
    }]


def test_auto_plan_keeps_the_forward_order_of_the_units():
    units = whole_model(block_gib=(1,) * 12)
    plan = resolve("auto", False, "1F1B", 1, [units])
    assert list(plan[0]) == [u.name for u in units]
    assert [name for name, d in plan[0].items() if not d.reshard] == ["layers.11", ""]


def test_auto_last_block_is_the_last_non_root_unit_even_when_the_root_is_not_last():
    units = [FsdpUnit("", GIB), FsdpUnit("layers.0", GIB), FsdpUnit("layers.1", GIB)]
    plan = resolve("auto", False, "1F1B", 1, [units])
    assert plan == [{
        "": Decision(False, ROOT),
        "layers.0": Decision(True, FREED),
        "layers.1": Decision(False, LAST),
    }]


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
    assert flags(plan) == [{"tok_embeddings": True, "layers.0": True, "layers.1": True, "layers.2": False, "": False}]


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
        {"tok_embeddings": Decision(False, kept), "layers.0": Decision(False, kept), "layers.1": Decision(False, kept)},
        {"layers.4": Decision(False, kept), "layers.5": Decision(False, kept), "": Decision(False, ROOT)},
    ]
    assert f"instead of {n_microbatches}" in plan[0]["layers.0"].reason
    assert kept_bytes(plan, parts) == 6 * GIB


def test_resolve_returns_one_dict_per_part_even_for_empty_parts():
    assert resolve("auto", True, "1F1B", 4, []) == []
    assert resolve("auto", True, "Interleaved1F1B", 4, [[], [FsdpUnit("layers.0", 1)]]) == [
        {}, {"layers.0": Decision(False, pp_kept(4))}
    ]


# --------------------------------------------------------------------------- free_bytes (memory budget), one part


def test_free_bytes_without_pp_frees_the_last_block_and_never_the_root():
    # Without PP auto keeps only layers.2 and the root; any free_bytes > 0 frees layers.2.
    parts = [whole_model()]
    plan = resolve("auto", False, "1F1B", 1, parts, free_bytes=1, budget_note=NOTE)
    assert plan == [{
        "tok_embeddings": Decision(True, FREED),  # freed by auto already: not counted, reason unchanged
        "layers.0": Decision(True, FREED),
        "layers.1": Decision(True, FREED),
        "layers.2": Decision(True, budget_freed()),
        "": Decision(False, ROOT),  # kept units get no extra note
    }]
    assert kept_bytes(plan, parts) == GIB


def test_free_bytes_under_pp_frees_the_earliest_blocks_first():
    parts = [[FsdpUnit("layers.0", GIB), FsdpUnit("layers.1", 2 * GIB), FsdpUnit("layers.2", GIB),
              FsdpUnit("layers.3", GIB), FsdpUnit("", GIB)]]
    plan = resolve("auto", True, "GPipe", 4, parts, free_bytes=3 * GIB, budget_note=NOTE)  # 1 + 2 GiB
    assert plan == [{
        "layers.0": Decision(True, budget_freed()),
        "layers.1": Decision(True, budget_freed()),
        "layers.2": Decision(False, pp_kept(4)),
        "layers.3": Decision(False, pp_kept(4)),
        "": Decision(False, ROOT),
    }]
    assert kept_bytes(plan, parts) == 3 * GIB


@pytest.mark.parametrize("free,freed", [
    (1, ["layers.0"]),
    (GIB, ["layers.0"]),  # exactly met: the next block stays
    (GIB + 1, ["layers.0", "layers.1"]),  # a block is freed whole even when part of it would do
    (3 * GIB, ["layers.0", "layers.1"]),
    (3 * GIB + 1, ["layers.0", "layers.1", "layers.2"]),
])
def test_free_bytes_stops_once_enough_is_freed(free, freed):
    parts = [[FsdpUnit("layers.0", GIB), FsdpUnit("layers.1", 2 * GIB), FsdpUnit("layers.2", GIB),
              FsdpUnit("layers.3", GIB), FsdpUnit("", GIB)]]
    plan = resolve("auto", True, "1F1B", 4, parts, free_bytes=free, budget_note=NOTE)
    assert [name for name, d in plan[0].items() if d.reshard] == freed
    assert all(plan[0][name].reason == budget_freed() for name in freed)
    assert all(d.reason in (pp_kept(4), ROOT) for d in plan[0].values() if not d.reshard)


def test_free_bytes_that_cannot_be_met_frees_every_non_root_unit():
    # Under PP everything starts kept; 10 GiB asked, 2 GiB of non-root units to give.
    parts = [[FsdpUnit("layers.0", GIB), FsdpUnit("layers.1", GIB), FsdpUnit("", 3 * GIB)]]
    plan = resolve("auto", True, "1F1B", 4, parts, free_bytes=10 * GIB, budget_note=NOTE)
    assert plan == [{
        "layers.0": Decision(True, budget_freed()),
        "layers.1": Decision(True, budget_freed()),
        "": Decision(False, ROOT),
    }]
    assert kept_bytes(plan, parts) == 3 * GIB


def test_free_bytes_never_frees_the_root_even_when_it_is_first():
    parts = [[FsdpUnit("", 4 * GIB), FsdpUnit("layers.0", GIB), FsdpUnit("layers.1", GIB)]]
    plan = resolve("auto", True, "1F1B", 2, parts, free_bytes=1, budget_note=NOTE)
    assert plan == [{
        "": Decision(False, ROOT),
        "layers.0": Decision(True, budget_freed()),
        "layers.1": Decision(False, pp_kept(2)),
    }]
    only_root = [[FsdpUnit("", 2 * GIB)]]
    plan = resolve("auto", True, "1F1B", 2, only_root, free_bytes=GIB, budget_note=NOTE)
    assert plan == [{"": Decision(False, ROOT)}]


def moe_parts() -> list[list[FsdpUnit]]:
    """Two MoE blocks (DeepSeek-V3): 1 GiB of dense weights and 2 GiB of routed experts each,
    the experts a unit of their own inside the block; a 1 GiB root."""
    experts = UnitKind.EXPERTS
    return [[
        FsdpUnit("layers.0", GIB, block="layers.0"), FsdpUnit("layers.0.moe.experts", 2 * GIB, "layers.0", experts),
        FsdpUnit("layers.1", GIB, block="layers.1"), FsdpUnit("layers.1.moe.experts", 2 * GIB, "layers.1", experts),
        FsdpUnit("", GIB),
    ]]


def test_free_bytes_frees_a_block_together_with_its_experts():
    parts = moe_parts()
    # 1 byte asked: the whole first block goes (3 GiB), the second stays whole.
    plan = resolve("auto", True, "1F1B", 4, parts, free_bytes=1, budget_note=NOTE)
    assert plan == [{
        "layers.0": Decision(True, budget_freed()),
        "layers.0.moe.experts": Decision(True, budget_freed()),
        "layers.1": Decision(False, pp_kept(4)),
        "layers.1.moe.experts": Decision(False, pp_kept(4)),
        "": Decision(False, ROOT),
    }]
    assert kept_bytes(plan, parts) == 4 * GIB
    # The experts count towards what is freed: 3 GiB is met by the first block alone ...
    plan = resolve("auto", True, "1F1B", 4, parts, free_bytes=3 * GIB, budget_note=NOTE)
    assert flags(plan) == flags(resolve("auto", True, "1F1B", 4, parts, free_bytes=1, budget_note=NOTE))
    # ... one byte more takes the second block with its experts too.
    plan = resolve("auto", True, "1F1B", 4, parts, free_bytes=3 * GIB + 1, budget_note=NOTE)
    assert flags(plan) == [{"layers.0": True, "layers.0.moe.experts": True, "layers.1": True,
                            "layers.1.moe.experts": True, "": False}]
    assert kept_bytes(plan, parts) == GIB


def test_free_bytes_without_pp_frees_the_last_block_with_its_experts():
    # Without PP "last" speaks of blocks: layers.1 and its experts are kept, then freed together.
    parts = moe_parts()
    assert flags(resolve("auto", False, "1F1B", 1, parts)) == [{
        "layers.0": True, "layers.0.moe.experts": True, "layers.1": False, "layers.1.moe.experts": False, "": False}]
    plan = resolve("auto", False, "1F1B", 1, parts, free_bytes=1, budget_note=NOTE)
    assert plan == [{
        "layers.0": Decision(True, FREED),
        "layers.0.moe.experts": Decision(True, FREED),
        "layers.1": Decision(True, budget_freed()),
        "layers.1.moe.experts": Decision(True, budget_freed()),
        "": Decision(False, ROOT),
    }]


@pytest.mark.parametrize("free", [0, -1, -GIB])
@pytest.mark.parametrize("pp_enabled,schedule", [(False, "1F1B"), (True, "1F1B"), (True, "ZBVZeroBubble")])
def test_zero_or_negative_free_bytes_changes_nothing(free, pp_enabled, schedule):
    parts = interleaved_parts()
    plain = resolve("auto", pp_enabled, schedule, 4, parts)
    assert resolve("auto", pp_enabled, schedule, 4, parts, free_bytes=free, budget_note=NOTE) == plain


def test_the_budget_note_is_put_in_the_reason_verbatim():
    parts = [[FsdpUnit("layers.0", 512 * MIB), FsdpUnit("layers.1", 256 * MIB), FsdpUnit("", 256 * MIB)]]
    note = "predicted peak 79.31 GiB > budget 71.99 GiB"
    plan = resolve("auto", True, "1F1B", 2, parts, free_bytes=100 * MIB, budget_note=note)
    assert reasons(plan) == [{
        "layers.0": "auto, memory budget: predicted peak 79.31 GiB > budget 71.99 GiB; freed (earliest first)",
        "layers.1": pp_kept(2),
        "": ROOT,
    }]


# --------------------------------------------------------------------------- free_bytes, several parts


def interleaved_parts() -> list[list[FsdpUnit]]:
    """Pipeline rank 0 of an interleaved schedule: stages 0 and 2 (5 GiB in all)."""
    return [
        [FsdpUnit("tok_embeddings", GIB // 2), FsdpUnit("layers.0", GIB), FsdpUnit("layers.1", GIB)],
        [FsdpUnit("layers.4", GIB), FsdpUnit("layers.5", GIB), FsdpUnit("", GIB // 2)],
    ]


def test_free_bytes_counts_all_parts_of_the_rank_and_finishes_part_0_first():
    parts = interleaved_parts()
    # part 0 gives 2.5 GiB, then layers.4 brings it to 3.5 GiB >= 3 GiB
    plan = resolve("auto", True, "Interleaved1F1B", 4, parts, free_bytes=3 * GIB, budget_note=NOTE)
    assert plan == [
        {
            "tok_embeddings": Decision(True, budget_freed()),
            "layers.0": Decision(True, budget_freed()),
            "layers.1": Decision(True, budget_freed()),
        },
        {
            "layers.4": Decision(True, budget_freed()),
            "layers.5": Decision(False, pp_kept(4)),
            "": Decision(False, ROOT),
        },
    ]
    assert kept_bytes(plan, parts) == 3 * GIB // 2


def test_free_bytes_met_inside_part_0_leaves_part_1_alone():
    parts = interleaved_parts()
    plan = resolve("auto", True, "LoopedBFS", 4, parts, free_bytes=5 * GIB // 2, budget_note=NOTE)  # 2.5 GiB
    assert flags(plan) == [
        {"tok_embeddings": True, "layers.0": True, "layers.1": True},
        {"layers.4": False, "layers.5": False, "": False},
    ]
    assert reasons(plan)[1] == {"layers.4": pp_kept(4), "layers.5": pp_kept(4), "": ROOT}
    assert kept_bytes(plan, parts) == 5 * GIB // 2


def test_free_bytes_is_for_the_rank_not_for_each_part():
    # 1.5 GiB for the rank: part 0 gives it (embeddings + layers.0); part 1 is not asked again.
    parts = interleaved_parts()
    plan = resolve("auto", True, "Interleaved1F1B", 4, parts, free_bytes=3 * GIB // 2, budget_note=NOTE)
    assert flags(plan) == [
        {"tok_embeddings": True, "layers.0": True, "layers.1": False},
        {"layers.4": False, "layers.5": False, "": False},
    ]
    assert kept_bytes(plan, parts) == 7 * GIB // 2


# --------------------------------------------------------------------------- free_bytes + zero bubble


@pytest.mark.parametrize("schedule", ZERO_BUBBLE)
def test_free_bytes_under_zero_bubble_is_rejected(schedule):
    with pytest.raises(ReshardPolicyError) as info:
        resolve("auto", True, schedule, 8, interleaved_parts(), free_bytes=1, budget_note=NOTE)
    assert str(info.value) == (
        f"--parallelism.pipeline_parallel_schedule={schedule} with the memory budget"
        " (predicted peak 5.00 GiB > budget 4.00 GiB): zero-bubble schedules give wrong gradients when FSDP2"
        " reshards after forward (torch 2.13); use a larger --parallelism.memory_budget_gib (or -1),"
        " --parallelism.reshard_after_forward=never, or another schedule"
    )


@pytest.mark.parametrize("schedule", ZERO_BUBBLE)
def test_no_free_bytes_under_zero_bubble_is_accepted(schedule):
    parts = interleaved_parts()
    plan = resolve("auto", True, schedule, 8, parts, free_bytes=0, budget_note=NOTE)
    assert plan == [
        {"tok_embeddings": Decision(False, pp_kept(8)), "layers.0": Decision(False, pp_kept(8)),
         "layers.1": Decision(False, pp_kept(8))},
        {"layers.4": Decision(False, pp_kept(8)), "layers.5": Decision(False, pp_kept(8)), "": Decision(False, ROOT)},
    ]


def test_free_bytes_with_only_a_root_under_zero_bubble_does_not_raise():
    # Nothing could be resharded, so the zero-bubble restriction is not violated.
    plan = resolve("auto", True, "ZBVZeroBubble", 4, [[FsdpUnit("", 2 * GIB)]], free_bytes=GIB, budget_note=NOTE)
    assert plan == [{"": Decision(False, ROOT)}]


def test_free_bytes_with_a_zero_bubble_schedule_name_but_no_pp_frees_as_usual():
    plan = resolve("auto", False, "ZBVZeroBubble", 1, [whole_model()], free_bytes=1, budget_note=NOTE)
    assert plan[0]["layers.2"] == Decision(True, budget_freed())
    assert plan[0][""] == Decision(False, ROOT)


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
        unit = "tok_embeddings" if name.startswith("tok_embeddings") else (
            ".".join(name.split(".")[:2]) if name.startswith("layers.") else "")
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
    layout = plan_pipeline(6, 2, "1F1B", -1, [], 8)
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

