"""reshard_after_forward = auto | always | never -> a per-unit plan. Pure: no process group,
no model, only the policy, the pipeline facts and the FSDP units with their sizes.

This is the only place that decides resharding; FSDP2 and SimpleFSDP, Llama3 and
DeepSeek-V3 all apply what `resolve` returns.

Why "auto" decides as it does:
- Under pipeline parallel every microbatch runs forward separately. A unit that reshards is
  gathered again in every microbatch's forward and backward; one that does not is gathered
  once per step. So under PP nothing reshards (unless a memory budget forces it).
- Without PP, resharding a block frees its parameters from its forward until its backward.
  The last block's backward starts right after its forward, so resharding it saves nothing
  and costs one gather. The root unit (final norm + output) runs first in backward: FSDP
  gathers it again at once, so it never reshards.
"""

from torchtitan.distributed.pipeline_layout import ZERO_BUBBLE
from torchtitan.distributed.plan import Decision, FsdpUnit

POLICIES = ("auto", "always", "never")
GIB = 2**30


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


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def resolve(
    policy: str,
    pp_enabled: bool,
    schedule: str,
    n_microbatches: int,
    parts: list[list[FsdpUnit]],
    budget_bytes: int = 0,
) -> list[dict[str, Decision]]:
    """One {unit name: Decision} per model part of this rank (parts in pipeline order, units
    in forward order)."""
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
                decisions[unit.name] = Decision(False, "root: backward starts here, FSDP would gather it again at once")
            elif policy == "always":
                decisions[unit.name] = Decision(True, "always: freed after forward (ZeRO-3)")
            elif pp_enabled:
                decisions[unit.name] = Decision(
                    False, f"auto, PP: kept, 1 gather per step instead of {n_microbatches} (one per microbatch)"
                )
            elif unit.position == last_block:
                decisions[unit.name] = Decision(False, "auto: last in forward, its backward follows at once")
            else:
                decisions[unit.name] = Decision(True, "auto: freed from its forward until its backward")
        plan.append(decisions)

    if policy == "auto" and budget_bytes > 0:
        _fit_budget(plan, parts, budget_bytes, zero_bubble, schedule)
    return plan


def _fit_budget(plan: list[dict[str, Decision]], parts: list[list[FsdpUnit]], budget: int, zero_bubble: bool,
                schedule: str) -> None:
    """Reshard kept non-root blocks (each with its nested units), earliest in forward order
    first, until the kept bytes of all of the rank's parts fit the budget."""
    sizes = {(i, u.name): u.param_bytes for i, units in enumerate(parts) for u in units}

    def kept() -> int:
        return sum(sizes[(i, n)] for i, d in enumerate(plan) for n, dec in d.items() if not dec.reshard)

    before = kept()
    if before <= budget:
        _note_kept(plan, f"fits the budget ({_gib(before)} <= {_gib(budget)})")
        return
    for i, units in enumerate(parts):
        for unit in units:
            if kept() <= budget:
                _note_kept(plan, f"fits the budget once earlier units reshard ({_gib(kept())} <= {_gib(budget)})")
                return
            if unit.is_root or plan[i][unit.name].reshard:
                continue
            if zero_bubble:
                raise ReshardPolicyError(_zero_bubble_message(
                    schedule, f"reshard_budget_gib={budget / GIB:g} (needs resharding: {_gib(before)} kept)"
                ))
            # A block is freed whole (with its experts): one AC region serves all its gathers.
            decision = Decision(True, f"auto, budget: {_gib(kept())} kept > {_gib(budget)}, freed (earliest first)")
            for other in units:
                if other.position == unit.position and not other.is_root:
                    plan[i][other.name] = decision
    if kept() > budget:
        _note_kept(plan, f"budget {_gib(budget)} cannot be met ({_gib(kept())} kept)")
    else:
        _note_kept(plan, f"fits the budget once earlier units reshard ({_gib(kept())} <= {_gib(budget)})")


def _note_kept(plan: list[dict[str, Decision]], note: str) -> None:
    for decisions in plan:
        for name, dec in decisions.items():
            if not dec.reshard:
                decisions[name] = Decision(False, f"{dec.reason}; {note}")


def _zero_bubble_message(schedule: str, what: str) -> str:
    return (
        f"--parallelism.pipeline_parallel_schedule={schedule} with {what}: zero-bubble schedules"
        " give wrong gradients when FSDP2 reshards after forward (torch 2.13); use"
        " --parallelism.reshard_after_forward=auto without a budget, or never, or another schedule"
    )


def kept_bytes(plan: list[dict[str, Decision]], parts: list[list[FsdpUnit]]) -> int:
    return sum(u.param_bytes for d, units in zip(plan, parts) for u in units if not d[u.name].reshard)
