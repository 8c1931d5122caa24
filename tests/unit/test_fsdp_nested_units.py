"""Which nested FSDP2 units are gathered at their AC region's entry (distributed/fsdp.py,
nested_in_regions): a block's resharding experts under PP inside a checkpoint region, and
nothing else; pure, no process group."""

import pytest

from torchtitan.distributed.fsdp import nested_in_regions
from torchtitan.distributed.plan import Decision, FsdpUnit, PartPlan, RegionSpec, UnitKind

OP, NO_AC = RegionSpec("op", None), RegionSpec("none", None)


def _plan(experts_reshard: bool, region: RegionSpec | None, microbatches: int) -> PartPlan:
    units = (
        FsdpUnit("layers.1", block="layers.1", decision=Decision(True, "")),
        FsdpUnit(
            "layers.1.moe.experts",
            block="layers.1",
            kind=UnitKind.EXPERTS,
            decision=Decision(experts_reshard, ""),
        ),
        FsdpUnit("", decision=Decision(False, "")),
    )
    return PartPlan(0, units, microbatches, {"layers.1": region} if region else {})


@pytest.mark.parametrize(
    "reshard,region,microbatches,expected",
    [
        (True, OP, 4, [("layers.1.moe.experts", "layers.1")]),
        (True, RegionSpec("full", None), 2, [("layers.1.moe.experts", "layers.1")]),
        (True, OP, 1, []),  # no PP: forward and recompute find the experts alike
        (False, OP, 4, []),  # kept: never gathered inside the region after the first time
        (True, NO_AC, 4, []),  # no checkpointing: nothing is recomputed
        (True, None, 4, []),
    ],
)
def test_nested_units_gathered_at_region_entry(reshard, region, microbatches, expected):
    assert nested_in_regions(_plan(reshard, region, microbatches)) == expected
