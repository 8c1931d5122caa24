"""reshard_after_forward = auto | always | never -> a per-unit plan. Pure: no process group,
no model, only the policy, the pipeline facts and the FSDP units with their sizes.

This is the only place that decides resharding; FSDP2 and SimpleFSDP, Llama3 and
DeepSeek-V3 all apply what `resolve` returns.

Why "auto" decides as it does:
- Under pipeline parallel every microbatch runs forward separately. A unit that reshards is
  gathered again in every microbatch's forward and backward; one that does not is gathered
  once per step. So under PP nothing reshards (unless the memory budget forces it).
- Without PP, resharding a block frees its parameters from its forward until its backward.
  The last block's backward starts right after its forward, so resharding it saves nothing
  and costs one gather. The root unit (final norm + output) runs first in backward: FSDP
  gathers it again at once, so it never reshards.
- With a memory budget (`[planning] memory_budget_gib`), the memory prediction says how
  many kept bytes a rank must free for its predicted peak to fit (`free_bytes`). Every kept
  unit of a rank saves the same gathers per byte (one per microbatch, or per step under PP),
  so the earliest in forward order go first: they hold their parameters the longest.
"""

from torchtitan.distributed.pipeline_layout import ZERO_BUBBLE
from torchtitan.distributed.plan import Decision, FsdpUnit

POLICIES = ("auto", "always", "never")


class ReshardPolicyError(ValueError):
    pass


def check_policy(policy: str, pp_enabled: bool, schedule: str) -> None:
    """The policy name, and the schedules it cannot run with (the config check calls this too)."""
    if policy not in POLICIES:
        raise ReshardPolicyError(
            f"--parallelism.reshard_after_forward={policy!r}: choose one of {', '.join(POLICIES)}"
        )
    if policy == "always" and pp_enabled and schedule in ZERO_BUBBLE:
        raise ReshardPolicyError(
            f"--parallelism.reshard_after_forward=always with --parallelism.pipeline_parallel_schedule={schedule}:"
            " zero-bubble schedules give wrong gradients when FSDP2 reshards after forward (torch 2.13); use"
            " auto or never, or a non-zero-bubble schedule"
        )


def resolve(
    policy: str,
    pp_enabled: bool,
    schedule: str,
    n_microbatches: int,
    parts: list[list[FsdpUnit]],
    *,
    free_bytes: int = 0,
    budget_note: str = "",
) -> list[dict[str, Decision]]:
    """One {unit name: Decision} per model part of this rank (parts in pipeline order, units
    in forward order). `free_bytes`: kept unsharded bytes to free for the memory budget
    (`budget_note` says why, e.g. "predicted peak 1.20 GiB > budget 1.00 GiB")."""
    check_policy(policy, pp_enabled, schedule)
    zero_bubble = pp_enabled and schedule in ZERO_BUBBLE

    plan: list[dict[str, Decision]] = []
    for units in parts:
        # "Last" speaks of blocks: every unit of the last block (its experts too) runs its
        # backward right after its forward.
        blocks = [u.position for u in units if not u.is_root]
        last_block = blocks[-1] if blocks else None
        decisions = {}
        for unit in units:
            if policy == "never":
                decisions[unit.name] = Decision(False, "never: kept for backward (ZeRO-2)")
            elif unit.is_root:
                decisions[unit.name] = Decision(
                    False, "root: backward starts here, FSDP would gather it again at once"
                )
            elif policy == "always":
                decisions[unit.name] = Decision(True, "always: freed after forward (ZeRO-3)")
            elif pp_enabled:
                decisions[unit.name] = Decision(
                    False,
                    f"auto, PP: kept, 1 gather per step instead of {n_microbatches} (one per microbatch)",
                )
            elif unit.position == last_block:
                decisions[unit.name] = Decision(
                    False, "auto: last in forward, its backward follows at once"
                )
            else:
                decisions[unit.name] = Decision(
                    True, "auto: freed from its forward until its backward"
                )
        plan.append(decisions)

    if policy == "auto" and free_bytes > 0:
        _free_for_budget(
            plan, parts, free_bytes, budget_note, zero_bubble=zero_bubble, schedule=schedule
        )
    return plan


def _free_for_budget(
    plan: list[dict[str, Decision]],
    parts: list[list[FsdpUnit]],
    free_bytes: int,
    note: str,
    *,
    zero_bubble: bool,
    schedule: str,
) -> None:
    """Reshard kept non-root blocks (each with its nested units), earliest in forward order
    first, until `free_bytes` of unsharded parameters are freed (or none is left)."""
    freed = 0
    for i, units in enumerate(parts):
        for unit in units:
            if freed >= free_bytes:
                return
            if unit.is_root or plan[i][unit.name].reshard:
                continue
            if zero_bubble:
                raise ReshardPolicyError(
                    _zero_bubble_message(schedule, f"the memory budget ({note})")
                )
            # A block is freed whole (with its experts): one AC region serves all its gathers.
            decision = Decision(True, f"auto, memory budget: {note}; freed (earliest first)")
            for other in units:
                if (
                    other.position == unit.position
                    and not other.is_root
                    and not plan[i][other.name].reshard
                ):
                    plan[i][other.name] = decision
                    freed += other.param_bytes


def _zero_bubble_message(schedule: str, what: str) -> str:
    return (
        f"--parallelism.pipeline_parallel_schedule={schedule} with {what}: zero-bubble schedules"
        " give wrong gradients when FSDP2 reshards after forward (torch 2.13); use"
        " a larger --planning.memory_budget_gib (or none), --parallelism.reshard_after_forward=never, or another"
        " schedule"
    )


def kept_bytes(plan: list[dict[str, Decision]], parts: list[list[FsdpUnit]]) -> int:
    return sum(
        u.param_bytes for d, units in zip(plan, parts) for u in units if not d[u.name].reshard
    )
