"""What the reshard-policy tests share: the reasons resolve gives (asserted verbatim, so that
a change of wording is noticed), schedule lists and small unit layouts."""

import typing

from torchtitan.config import job_config as jc
from torchtitan.config.manager import field_types
from torchtitan.distributed.plan import FsdpUnit
from torchtitan.units import GIB

NEVER = "never: kept for backward (ZeRO-2)"
ROOT = "root: backward starts here, FSDP would gather it again at once"
ALWAYS = "always: freed after forward (ZeRO-3)"
LAST = "auto: last in forward, its backward follows at once"
FREED = "auto: freed from its forward until its backward"


def pp_kept(n_microbatches: int) -> str:
    return f"auto, PP: kept, 1 gather per step instead of {n_microbatches} (one per microbatch)"


# The reason of a unit freed for the memory budget: the note (what the memory prediction
# says, torchtitan/planning/memory/predict.py) is put in verbatim.
NOTE = "predicted peak 5.00 GiB > budget 4.00 GiB"


def budget_freed(note: str = NOTE) -> str:
    return f"auto, memory budget: {note}; freed (earliest first)"


# every schedule --parallelism.pipeline_parallel_schedule accepts; the zero-bubble ones (their
# backward split in two) named here, as the tests expect them
ALL_SCHEDULES = list(typing.get_args(field_types(jc.Parallelism)["pipeline_parallel_schedule"]))
# a CSV schedule (PipelineScheduleMulti) may split backward into I and W: zero-bubble for FSDP
ZERO_BUBBLE = ["InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV", "PipelineScheduleMulti"]
OTHER_SCHEDULES = [s for s in ALL_SCHEDULES if s not in ZERO_BUBBLE]


def whole_model(block_gib=(1, 1, 1), emb_gib=1, root_gib=1) -> list[FsdpUnit]:
    """One part without PP: embeddings, blocks, root, sizes in GiB."""
    units = [FsdpUnit("tok_embeddings", int(emb_gib * GIB))]
    units += [FsdpUnit(f"layers.{i}", int(g * GIB)) for i, g in enumerate(block_gib)]
    return units + [FsdpUnit("", int(root_gib * GIB))]


def flags(plan) -> list[dict[str, bool]]:
    return [{name: d.reshard for name, d in part.items()} for part in plan]


def reasons(plan) -> list[dict[str, str]]:
    return [{name: d.reason for name, d in part.items()} for part in plan]
