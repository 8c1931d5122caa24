"""The FSDP units of a model part, and the one function that applies data parallelism
(FSDP2, HSDP, DDP or SimpleFSDP) to a part from its plan. Every model's parallelize calls
`apply_data_parallel`; every model's train spec builds its units with `build_units`.

A model says only which submodules are units, in forward order, with the block each
belongs to and whether it holds routed experts (model.fsdp_units()). Everything else is
decided here: what a unit's parameters cost on one rank, which mesh it shards over, the
root unit ("" = whatever no unit took: final norm, output, ...).
"""

from typing import Callable

from torch import nn

from torchtitan.distributed.fsdp import apply_ddp, apply_fsdp2, mixed_precision, unit_param_bytes
from torchtitan.distributed.reshard_policy import Unit
from torchtitan.distributed.simple_fsdp import UnitSpec, fsdp_group_names, simple_fsdp

DTYPE_BYTES = {"float32": 4, "bfloat16": 2}


def build_units(
    model: nn.Module, tp: int, ep: int, dtype_bytes: int, tp_whole: Callable[[str], bool] = lambda name: False,
) -> list[Unit]:
    """FSDP units of a model part in forward order with the unsharded bytes one rank holds.

    TP splits every matrix except those `tp_whole(param name)` names (e.g. replicated LoRA
    down-projections) and replicates vectors; EP splits routed experts, which TP never does.
    """
    declared = list(model.fsdp_units())  # (name, block or None, holds routed experts)
    names = [name for name, _, _ in declared] + [""]
    experts = {name for name, _, is_experts in declared if is_experts}

    def owner_prefix(pname: str) -> str | None:
        return next((u for u in experts if pname.startswith(u + ".")), None)

    def size_of(pname: str, p) -> int:
        if owner_prefix(pname) is not None:
            return dtype_bytes * (p.numel() // ep)
        return dtype_bytes * (p.numel() // tp if p.dim() >= 2 and not tp_whole(pname) else p.numel())

    sizes = unit_param_bytes(model, names, size_of)
    units = [Unit(name, sizes[name], block=block, mesh="experts" if is_experts else "dp")
             for name, block, is_experts in declared if sizes[name] > 0]
    if sizes[""] > 0:
        units.append(Unit("", sizes[""], is_root=True))
    return units


def simple_fsdp_units(plan, ep: int) -> list[UnitSpec]:
    """SimpleFSDP's view of a part's plan. Under PP a unit the plan keeps is gathered once per
    step, unless its AC region recomputes FSDP's gathers (fsdp_ac_policy=recompute asks for
    a gather per microbatch, redone in backward)."""
    specs = []
    for u in plan.units:
        region = plan.regions.get(u.block if u.block is not None else u.name)  # a block's, or its own
        reshard = plan.reshard[u.name].reshard
        specs.append(UnitSpec(
            u.name, experts=ep > 1 and u.mesh == "experts",
            once_per_step=plan.microbatches > 1 and not reshard and (region is None or region.fsdp_comm != "recompute"),
            regather_by_hooks=reshard and region is not None and region.by_hooks,
        ))
    return specs


def apply_data_parallel(model: nn.Module, dims, cfg, param_dtype: str, plan) -> None:
    """FSDP2 / HSDP / DDP / SimpleFSDP on one model part, each unit as `plan` (a ModelPart)
    says.

    FSDP2 shards nested units (experts) before their block, each on its own mesh. Experts'
    gradients are averaged over every data-parallel rank, not only over the experts' mesh:
    each EP rank's expert gradient already sums the tokens of its whole EP group.
    """
    p = cfg.parallelism
    mp = mixed_precision(param_dtype, cfg.training.mixed_precision_reduce)
    mesh, dp_dims = dims.mesh, dims.dp_dims()
    units, reshard = plan.units, plan.reshard_flags
    if p.fsdp_implementation == "simple_fsdp":
        simple_fsdp(model, mesh, dp_dims, param_dtype, cfg.training.mixed_precision_reduce,
                    simple_fsdp_units(plan, dims.ep), plan.microbatches)
    elif dp_dims == ["dp_replicate"]:
        apply_ddp(model, mesh["dp_replicate"], mp, [u.name for u in units])
    else:
        meshes = {"dp": dims.submesh("fsdp"), "experts": dims.submesh("experts_fsdp")}
        apply_fsdp2(model, meshes["dp"], [(u.name, meshes[u.mesh], reshard[u.name]) for u in units], mp,
                    experts_divide_factor=dims.dp if dims.ep > 1 else None,
                    experts={u.name for u in units if u.mesh == "experts"})


def fsdp_ac_groups(dims, cfg) -> frozenset[str]:
    """Process groups whose all-gathers are FSDP's inside AC regions (SimpleFSDP only):
    what fsdp_ac_policy saves or recomputes, never TP's or EP's collectives."""
    if cfg.parallelism.fsdp_implementation != "simple_fsdp":
        return frozenset()
    return frozenset(fsdp_group_names(dims.mesh, dims.dp_dims(), experts=dims.ep > 1))


def reshard_after_eval(model_parts) -> None:
    """Free the parameters FSDP2 left gathered after forwards without backward (evaluation).

    FSDP2 keeps a unit gathered after forward when it is not resharded (the root always),
    expecting the backward. After a no_grad forward none comes, and in torch 2.13 the next
    training backward then doubles that unit's gradients (measured: tok_embeddings, norm and
    output of the root, 2.0x). Resharding restores the state a training step starts from.
    SimpleFSDP keeps nothing after a no_grad forward."""
    from torch.distributed.fsdp import FSDPModule

    for part in model_parts:
        for module in part.modules():
            if isinstance(module, FSDPModule):
                module.reshard()
