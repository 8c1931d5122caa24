"""The plan of a model part, from the model's declaration to the collectives, in one record.

A model declares its FSDP units (`FsdpUnit(name, block=..., kind=...)`, forward order); the
build path fills in what one rank holds of each (`param_bytes`), the reshard decision
(reshard_policy.resolve) and the checkpoint region that holds it (activation_checkpoint.
region_specs), and gathers them in one `PartPlan` per model part. FSDP2, SimpleFSDP, DDP,
the AC wrapping, plan.json, the start-up table and the dry run read only this plan.

A unit is named by its submodule path, not held by reference: AC and torch.compile wrap
modules after planning, and a name keeps the plan pure (no torch here) and printable.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum

# The model contract (models.protocol): blocks live in `model.layers`, keyed by global index,
# so every block is named f"{BLOCKS}.<i>" in every layout.
BLOCKS = "layers"


class UnitKind(str, Enum):
    """Which data-parallel mesh a unit's parameters shard over."""

    DENSE = "dense"  # every rank of the data-parallel mesh
    EXPERTS = "experts"  # routed experts: what expert parallel leaves of it


@dataclass(frozen=True)
class Decision:
    """reshard_after_forward of one unit, and why."""

    reshard: bool
    reason: str


@dataclass(frozen=True)
class RegionSpec:
    """What one checkpoint region (a block, or a unit outside blocks) does."""

    compute: str  # "none" (no user AC), "full", or "op"
    fsdp_comm: str | None  # "save" | "recompute" | None (FSDP2: gathers happen outside the region)
    # A region only there to re-gather a resharding SimpleFSDP unit, in eager code: the unit
    # does it with saved-tensor hooks instead (no dispatch mode over every op of the block).
    by_hooks: bool = False

    @property
    def wrapped(self) -> bool:
        return (self.compute != "none" or self.fsdp_comm == "recompute") and not self.by_hooks

    @property
    def label(self) -> str:
        base = {"none": "no AC", "full": "full AC", "op": "op SAC"}[self.compute]
        return base if self.fsdp_comm is None else f"{base}, FSDP gathers {self.fsdp_comm}d"


@dataclass(frozen=True)
class FsdpUnit:
    """One FSDP unit of a model part."""

    name: str  # submodule path; "" is the root (what no other unit took: final norm, output)
    param_bytes: int = 0  # unsharded parameter bytes on this rank (after TP / EP), param dtype
    block: str | None = (
        None  # the transformer block it belongs to (a block, or experts nested in one)
    )
    kind: UnitKind = UnitKind.DENSE
    decision: Decision | None = None  # reshard_after_forward, once resolved
    region: RegionSpec | None = None  # the checkpoint region holding it (its block's, or its own)

    @property
    def is_root(self) -> bool:
        return self.name == ""

    @property
    def position(self) -> str:
        """What rules order by and regions are named after: its block, or itself."""
        return self.block or self.name

    @property
    def reshard(self) -> bool:
        if self.decision is None:
            raise ValueError(f"FSDP unit {self.name or '<root>'!r} has no reshard decision yet")
        return self.decision.reshard


@dataclass(frozen=True)
class PartPlan:
    """Everything decided for one model part (the whole model, or one pipeline stage)."""

    stage_id: int
    units: tuple[FsdpUnit, ...]  # forward order, root last
    microbatches: int = 1  # forward/backward passes per pipeline step (1 without PP)
    regions: dict[str, RegionSpec] = field(default_factory=dict)  # region name -> spec, in order

    @classmethod
    def assemble(
        cls,
        stage_id: int,
        units: list[FsdpUnit],
        decisions: dict[str, Decision],
        regions: dict[str, RegionSpec],
        microbatches: int,
    ) -> PartPlan:
        """Units with their decisions and the region that holds each (its block's, or its own)."""
        decided = tuple(
            replace(u, decision=decisions[u.name], region=regions.get(u.position)) for u in units
        )
        return cls(stage_id, decided, microbatches, dict(regions))

    def unit(self, name: str) -> FsdpUnit:
        for u in self.units:
            if u.name == name:
                return u
        raise KeyError(f"no FSDP unit {name!r} in stage {self.stage_id}")

    @property
    def reshard_flags(self) -> dict[str, bool]:
        return {u.name: u.reshard for u in self.units}

    def record(self) -> dict:
        """This part's plan.json entry. A unit's mesh is named only when it is not the dense
        data-parallel one (experts)."""
        return {
            "stage": self.stage_id,
            "fsdp_units": [
                {
                    "name": u.name or "<root>",
                    "reshard_after_forward": u.reshard,
                    "reason": u.decision.reason,
                    "param_bytes": u.param_bytes,
                    **({"mesh": "experts"} if u.kind is UnitKind.EXPERTS else {}),
                }
                for u in self.units
            ],
            "ac_regions": [
                {
                    "name": name,
                    "mode": spec.compute,
                    "fsdp_ac_policy": spec.fsdp_comm or "n/a",
                    "label": spec.label,
                }
                for name, spec in self.regions.items()
            ],
        }
