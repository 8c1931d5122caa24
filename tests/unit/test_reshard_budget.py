"""reshard_policy.resolve with a memory budget: the kept bytes the prediction says a rank is
over are freed, earliest in forward order first, whole blocks (with their experts), never
the root, across all of a rank's parts; not under zero-bubble schedules."""

import pytest
from reshard_cases import (
    FREED,
    NOTE,
    ROOT,
    ZERO_BUBBLE,
    budget_freed,
    flags,
    pp_kept,
    reasons,
    whole_model,
)

from torchtitan.distributed.plan import FsdpUnit, UnitKind
from torchtitan.distributed.reshard_policy import Decision, ReshardPolicyError, kept_bytes, resolve
from torchtitan.units import GIB

MIB = 2**20


# --------------------------------------------------------------------------- free_bytes (memory budget), one part


def test_free_bytes_without_pp_frees_the_last_block_and_never_the_root():
    # Without PP auto keeps only layers.2 and the root; any free_bytes > 0 frees layers.2.
    parts = [whole_model()]
    plan = resolve("auto", False, "1F1B", 1, parts, free_bytes=1, budget_note=NOTE)
    assert plan == [
        {
            "tok_embeddings": Decision(
                True, FREED
            ),  # freed by auto already: not counted, reason unchanged
            "layers.0": Decision(True, FREED),
            "layers.1": Decision(True, FREED),
            "layers.2": Decision(True, budget_freed()),
            "": Decision(False, ROOT),  # kept units get no extra note
        }
    ]
    assert kept_bytes(plan, parts) == GIB


def four_blocks() -> list[list[FsdpUnit]]:
    """One part under PP: four blocks of 1, 2, 1, 1 GiB and a 1 GiB root."""
    return [
        [
            FsdpUnit("layers.0", GIB),
            FsdpUnit("layers.1", 2 * GIB),
            FsdpUnit("layers.2", GIB),
            FsdpUnit("layers.3", GIB),
            FsdpUnit("", GIB),
        ]
    ]


def test_free_bytes_under_pp_frees_the_earliest_blocks_first():
    parts = four_blocks()
    plan = resolve(
        "auto", True, "GPipe", 4, parts, free_bytes=3 * GIB, budget_note=NOTE
    )  # 1 + 2 GiB
    assert plan == [
        {
            "layers.0": Decision(True, budget_freed()),
            "layers.1": Decision(True, budget_freed()),
            "layers.2": Decision(False, pp_kept(4)),
            "layers.3": Decision(False, pp_kept(4)),
            "": Decision(False, ROOT),
        }
    ]
    assert kept_bytes(plan, parts) == 3 * GIB


@pytest.mark.parametrize(
    "free,freed",
    [
        (1, ["layers.0"]),
        (GIB, ["layers.0"]),  # exactly met: the next block stays
        (GIB + 1, ["layers.0", "layers.1"]),  # a block is freed whole even when part of it would do
        (3 * GIB, ["layers.0", "layers.1"]),
        (3 * GIB + 1, ["layers.0", "layers.1", "layers.2"]),
    ],
)
def test_free_bytes_stops_once_enough_is_freed(free, freed):
    parts = four_blocks()
    plan = resolve("auto", True, "1F1B", 4, parts, free_bytes=free, budget_note=NOTE)
    assert [name for name, d in plan[0].items() if d.reshard] == freed
    assert all(plan[0][name].reason == budget_freed() for name in freed)
    assert all(d.reason in (pp_kept(4), ROOT) for d in plan[0].values() if not d.reshard)


def test_free_bytes_that_cannot_be_met_frees_every_non_root_unit():
    # Under PP everything starts kept; 10 GiB asked, 2 GiB of non-root units to give.
    parts = [[FsdpUnit("layers.0", GIB), FsdpUnit("layers.1", GIB), FsdpUnit("", 3 * GIB)]]
    plan = resolve("auto", True, "1F1B", 4, parts, free_bytes=10 * GIB, budget_note=NOTE)
    assert plan == [
        {
            "layers.0": Decision(True, budget_freed()),
            "layers.1": Decision(True, budget_freed()),
            "": Decision(False, ROOT),
        }
    ]
    assert kept_bytes(plan, parts) == 3 * GIB


def test_free_bytes_never_frees_the_root_even_when_it_is_first():
    parts = [[FsdpUnit("", 4 * GIB), FsdpUnit("layers.0", GIB), FsdpUnit("layers.1", GIB)]]
    plan = resolve("auto", True, "1F1B", 2, parts, free_bytes=1, budget_note=NOTE)
    assert plan == [
        {
            "": Decision(False, ROOT),
            "layers.0": Decision(True, budget_freed()),
            "layers.1": Decision(False, pp_kept(2)),
        }
    ]
    only_root = [[FsdpUnit("", 2 * GIB)]]
    plan = resolve("auto", True, "1F1B", 2, only_root, free_bytes=GIB, budget_note=NOTE)
    assert plan == [{"": Decision(False, ROOT)}]


def moe_parts() -> list[list[FsdpUnit]]:
    """Two MoE blocks (DeepSeek-V3): 1 GiB of dense weights and 2 GiB of routed experts each,
    the experts a unit of their own inside the block; a 1 GiB root."""
    experts = UnitKind.EXPERTS
    return [
        [
            FsdpUnit("layers.0", GIB, block="layers.0"),
            FsdpUnit("layers.0.moe.experts", 2 * GIB, "layers.0", experts),
            FsdpUnit("layers.1", GIB, block="layers.1"),
            FsdpUnit("layers.1.moe.experts", 2 * GIB, "layers.1", experts),
            FsdpUnit("", GIB),
        ]
    ]


def test_free_bytes_frees_a_block_together_with_its_experts():
    parts = moe_parts()
    # 1 byte asked: the whole first block goes (3 GiB), the second stays whole.
    plan = resolve("auto", True, "1F1B", 4, parts, free_bytes=1, budget_note=NOTE)
    assert plan == [
        {
            "layers.0": Decision(True, budget_freed()),
            "layers.0.moe.experts": Decision(True, budget_freed()),
            "layers.1": Decision(False, pp_kept(4)),
            "layers.1.moe.experts": Decision(False, pp_kept(4)),
            "": Decision(False, ROOT),
        }
    ]
    assert kept_bytes(plan, parts) == 4 * GIB
    # The experts count towards what is freed: 3 GiB is met by the first block alone ...
    plan = resolve("auto", True, "1F1B", 4, parts, free_bytes=3 * GIB, budget_note=NOTE)
    assert flags(plan) == flags(
        resolve("auto", True, "1F1B", 4, parts, free_bytes=1, budget_note=NOTE)
    )
    # ... one byte more takes the second block with its experts too.
    plan = resolve("auto", True, "1F1B", 4, parts, free_bytes=3 * GIB + 1, budget_note=NOTE)
    assert flags(plan) == [
        {
            "layers.0": True,
            "layers.0.moe.experts": True,
            "layers.1": True,
            "layers.1.moe.experts": True,
            "": False,
        }
    ]
    assert kept_bytes(plan, parts) == GIB


def test_free_bytes_without_pp_frees_the_last_block_with_its_experts():
    # Without PP "last" speaks of blocks: layers.1 and its experts are kept, then freed together.
    parts = moe_parts()
    assert flags(resolve("auto", False, "1F1B", 1, parts)) == [
        {
            "layers.0": True,
            "layers.0.moe.experts": True,
            "layers.1": False,
            "layers.1.moe.experts": False,
            "": False,
        }
    ]
    plan = resolve("auto", False, "1F1B", 1, parts, free_bytes=1, budget_note=NOTE)
    assert plan == [
        {
            "layers.0": Decision(True, FREED),
            "layers.0.moe.experts": Decision(True, FREED),
            "layers.1": Decision(True, budget_freed()),
            "layers.1.moe.experts": Decision(True, budget_freed()),
            "": Decision(False, ROOT),
        }
    ]


@pytest.mark.parametrize("free", [0, -1, -GIB])
@pytest.mark.parametrize(
    "pp_enabled,schedule", [(False, "1F1B"), (True, "1F1B"), (True, "ZBVZeroBubble")]
)
def test_zero_or_negative_free_bytes_changes_nothing(free, pp_enabled, schedule):
    parts = interleaved_parts()
    plain = resolve("auto", pp_enabled, schedule, 4, parts)
    assert (
        resolve("auto", pp_enabled, schedule, 4, parts, free_bytes=free, budget_note=NOTE) == plain
    )


def test_the_budget_note_is_put_in_the_reason_verbatim():
    parts = [
        [FsdpUnit("layers.0", 512 * MIB), FsdpUnit("layers.1", 256 * MIB), FsdpUnit("", 256 * MIB)]
    ]
    note = "predicted peak 79.31 GiB > budget 71.99 GiB"
    plan = resolve("auto", True, "1F1B", 2, parts, free_bytes=100 * MIB, budget_note=note)
    assert reasons(plan) == [
        {
            "layers.0": "auto, memory budget: predicted peak 79.31 GiB > budget 71.99 GiB; freed (earliest first)",
            "layers.1": pp_kept(2),
            "": ROOT,
        }
    ]


# --------------------------------------------------------------------------- free_bytes, several parts


def interleaved_parts() -> list[list[FsdpUnit]]:
    """Pipeline rank 0 of an interleaved schedule: stages 0 and 2 (5 GiB in all)."""
    return [
        [
            FsdpUnit("tok_embeddings", GIB // 2),
            FsdpUnit("layers.0", GIB),
            FsdpUnit("layers.1", GIB),
        ],
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
    plan = resolve(
        "auto", True, "LoopedBFS", 4, parts, free_bytes=5 * GIB // 2, budget_note=NOTE
    )  # 2.5 GiB
    assert flags(plan) == [
        {"tok_embeddings": True, "layers.0": True, "layers.1": True},
        {"layers.4": False, "layers.5": False, "": False},
    ]
    assert reasons(plan)[1] == {"layers.4": pp_kept(4), "layers.5": pp_kept(4), "": ROOT}
    assert kept_bytes(plan, parts) == 5 * GIB // 2


def test_free_bytes_is_for_the_rank_not_for_each_part():
    # 1.5 GiB for the rank: part 0 gives it (embeddings + layers.0); part 1 is not asked again.
    parts = interleaved_parts()
    plan = resolve(
        "auto", True, "Interleaved1F1B", 4, parts, free_bytes=3 * GIB // 2, budget_note=NOTE
    )
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
        " reshards after forward (torch 2.13); use a larger --planning.memory_budget_gib (or none),"
        " --parallelism.reshard_after_forward=never, or another schedule"
    )


@pytest.mark.parametrize("schedule", ZERO_BUBBLE)
def test_no_free_bytes_under_zero_bubble_is_accepted(schedule):
    parts = interleaved_parts()
    plan = resolve("auto", True, schedule, 8, parts, free_bytes=0, budget_note=NOTE)
    assert plan == [
        {
            "tok_embeddings": Decision(False, pp_kept(8)),
            "layers.0": Decision(False, pp_kept(8)),
            "layers.1": Decision(False, pp_kept(8)),
        },
        {
            "layers.4": Decision(False, pp_kept(8)),
            "layers.5": Decision(False, pp_kept(8)),
            "": Decision(False, ROOT),
        },
    ]


def test_free_bytes_with_only_a_root_under_zero_bubble_does_not_raise():
    # Nothing could be resharded, so the zero-bubble restriction is not violated.
    plan = resolve(
        "auto",
        True,
        "ZBVZeroBubble",
        4,
        [[FsdpUnit("", 2 * GIB)]],
        free_bytes=GIB,
        budget_note=NOTE,
    )
    assert plan == [{"": Decision(False, ROOT)}]


def test_free_bytes_with_a_zero_bubble_schedule_name_but_no_pp_frees_as_usual():
    plan = resolve(
        "auto", False, "ZBVZeroBubble", 1, [whole_model()], free_bytes=1, budget_note=NOTE
    )
    assert plan[0]["layers.2"] == Decision(True, budget_freed())
    assert plan[0][""] == Decision(False, ROOT)
