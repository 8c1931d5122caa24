"""Apply FSDP2 (`fully_shard`) or DDP (`replicate`) unit by unit, as a part's plan says.

Each FSDP unit (a submodule name, or "" for the root that holds whatever no unit took:
final norm, output, ...) shards over the data-parallel mesh of its kind, with its
reshard_after_forward. On a 2-D mesh (dp_replicate, dp_shard) fully_shard is HSDP.
"""

from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)

from torchtitan.distributed.parallel_dims import DataParallelMesh
from torchtitan.distributed.plan import FsdpUnit, PartPlan, UnitKind
from torchtitan.dtypes import DTYPES


def mixed_precision(param: str, reduce: str) -> MixedPrecisionPolicy:
    return MixedPrecisionPolicy(param_dtype=DTYPES[param], reduce_dtype=DTYPES[reduce])


def host_offload() -> CPUOffloadPolicy:
    """training.enable_cpu_offload: sharded parameters, gradients and optimizer states on the
    host. Pinned (overlapping copies) only where an accelerator exists to copy to: a CPU-only
    run holds everything on the host already, and the policy's copies are no-ops there."""
    return CPUOffloadPolicy(pin_memory=torch.accelerator.is_available())


def inner_first(units: tuple[FsdpUnit, ...]) -> list[FsdpUnit]:
    """The named units (the root left out) with nested ones (experts) before the units
    containing them, forward order otherwise: wrapping a block first would make its experts'
    parameters the block's."""
    named = [u for u in units if not u.is_root]
    nested = {u.name for u in named if any(u.name.startswith(o.name + ".") for o in named)}
    return sorted(named, key=lambda u: u.name not in nested)  # stable


def apply_fsdp2(
    model: nn.Module,
    plan: PartPlan,
    mesh_of: Callable[[UnitKind], DataParallelMesh],
    mp: MixedPrecisionPolicy,
    *,
    offload: OffloadPolicy | None = None,
) -> None:
    """fully_shard every unit of `plan` on its kind's mesh, nested ones (experts) before the
    units that contain them, then the root. `offload`: host_offload() or None."""
    policy = {} if offload is None else {"offload_policy": offload}
    for unit in inner_first(plan.units):
        dp = mesh_of(unit.kind)
        module = fully_shard(
            model.get_submodule(unit.name),
            mesh=dp.mesh,
            mp_policy=mp,
            reshard_after_forward=unit.reshard,
            **policy,
        )
        if dp.divide_factor is not None:
            # Divide by every data-parallel rank, not by this mesh. FSDP2 (torch 2.13) then
            # reduce-scatters with PREMUL_SUM, which gloo lacks: forcing SUM moves the
            # division after it. But with a shard group of size 1 it skips the reduce-scatter,
            # divides by the factor itself, and with SUM forced would divide a second time.
            module.set_gradient_divide_factor(float(dp.divide_factor))
            if dp.size(dp.shard) > 1:
                module.set_force_sum_reduction_for_comms(True)
    for unit, container in nested_in_regions(plan):
        gather_at_region_entry(model.get_submodule(container), model.get_submodule(unit))
    # The root's value is set explicitly: FSDP2 would otherwise reshard it after forward too.
    root = next((u.reshard for u in plan.units if u.is_root), False)
    fully_shard(
        model,
        mesh=mesh_of(UnitKind.DENSE).mesh,
        mp_policy=mp,
        reshard_after_forward=root,
        **policy,
    )


def nested_in_regions(plan: PartPlan) -> list[tuple[str, str]]:
    """(nested unit, the unit holding it) for each resharding nested unit (a block's experts)
    whose holder is an AC region, under PP. Checkpointing recomputes the region op for op,
    and FSDP2 gathers a nested unit inside it when its forward finds it sharded. Under PP a
    microbatch's forward can find it still gathered (PP does not reshard after a non-last
    microbatch's backward) while its recompute finds it resharded: the recompute would then
    gather inside the region, ops its forward did not run, which op SAC refuses."""
    if plan.microbatches <= 1:
        return []
    named = [u for u in plan.units if not u.is_root]
    out = []
    for u in named:
        holder = next((o.name for o in named if u.name.startswith(o.name + ".")), None)
        if (
            holder is not None
            and u.reshard
            and holder in plan.regions
            and plan.regions[holder].wrapped
        ):
            out.append((u.name, holder))
    return out


def gather_at_region_entry(holder: nn.Module, nested: nn.Module) -> None:
    """Gather `nested` (an FSDP2 module) before its holder's region runs: at the holder's
    forward and when its backward (and so the recompute) starts. Its own pre-forward then
    finds it gathered in the forward and in the recompute alike and runs no op of its own."""

    def before_forward(module, args, kwargs):
        nested.unshard()

    def after_forward(module, args, kwargs, output):
        outputs = [
            t
            for t in torch.utils._pytree.tree_leaves(output)
            if isinstance(t, torch.Tensor) and t.requires_grad
        ]
        if outputs:
            torch.autograd.graph.register_multi_grad_hook(
                outputs, lambda grads: nested.unshard(), mode="any"
            )
        return output

    holder.register_forward_pre_hook(before_forward, with_kwargs=True)
    holder.register_forward_hook(after_forward, with_kwargs=True)


def apply_ddp(
    model: nn.Module,
    plan: PartPlan,
    dp: DataParallelMesh,
    mp: MixedPrecisionPolicy,
    *,
    offload: OffloadPolicy | None = None,
) -> None:
    """Replicate (DDP semantics, FSDP2 machinery): one gradient all-reduce per unit."""
    from torch.distributed._composable.replicate_with_fsdp import replicate

    policy = {} if offload is None else {"offload_policy": offload}
    for unit in inner_first(plan.units):
        replicate(model.get_submodule(unit.name), mesh=dp.mesh, mp_policy=mp, **policy)
    replicate(model, mesh=dp.mesh, mp_policy=mp, **policy)


def unit_param_bytes(model: nn.Module, unit_names: list[str], size_of: Callable) -> dict[str, int]:
    """Bytes of the parameters each unit owns directly (nested units excluded; "" is the
    root), with `size_of(name, param) -> bytes` saying what one parameter costs on this rank."""
    owner = {}
    for unit in sorted(unit_names, key=len):  # outer units first, inner ones overwrite
        prefix = f"{unit}." if unit else ""
        for name, _ in model.named_parameters():
            if name.startswith(prefix):
                owner[name] = unit
    sizes = dict.fromkeys(unit_names, 0)
    for name, p in model.named_parameters():
        sizes[owner[name]] += size_of(name, p)
    return sizes
