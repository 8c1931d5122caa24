"""The FSDP units of a model part, and the one function that applies data parallelism
(FSDP2, HSDP, DDP or SimpleFSDP) to a part from its plan. Every model's parallelize calls
`apply_data_parallel`; the build path sizes every model's units with `size_units`.

A model says only which submodules are units, in forward order, with the block each
belongs to and its kind (model.fsdp_units()). Everything else is decided here: what a
unit's parameters cost on one rank, the root unit ("" = whatever no unit took: final norm,
output, ...); ParallelDims says which mesh each kind shards over.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from torch import nn

from torchtitan.distributed.fsdp import (
    apply_ddp,
    apply_fsdp2,
    host_offload,
    mixed_precision,
    unit_param_bytes,
)
from torchtitan.distributed.parallel_dims import ParallelDims
from torchtitan.distributed.plan import FsdpUnit, PartPlan, UnitKind
from torchtitan.distributed.simple_fsdp import simple_fsdp


@dataclass(frozen=True)
class Precision:
    """The dtypes data parallelism works in: the parameters' in forward and backward (what
    FSDP gathers in; "auto" already resolved by the build path) and the gradients' reduction;
    and where FSDP2 keeps the states between uses."""

    param: str  # "float32" | "bfloat16"
    reduce: str  # training.mixed_precision_reduce
    # training.enable_cpu_offload: FSDP2 keeps parameters, gradients and optimizer states on
    # the host (CPUOffloadPolicy); checks/optimizer.py refused it for SimpleFSDP
    cpu_offload: bool = False


def size_units(
    model: nn.Module, tp: int, ep: int, dtype_bytes: int, tp_whole: tuple[str, ...] = ()
) -> list[FsdpUnit]:
    """The model's declared FSDP units in forward order, with the unsharded bytes one rank
    holds, and the root unit when it owns anything.

    TP splits every matrix except those whose name contains one of `tp_whole` (e.g.
    replicated LoRA down-projections) and replicates vectors; EP splits routed experts,
    which TP never does.
    """
    declared: list[FsdpUnit] = list(model.fsdp_units())
    experts = [u.name for u in declared if u.kind is UnitKind.EXPERTS]

    def size_of(pname: str, p) -> int:
        if any(pname.startswith(name + ".") for name in experts):
            return dtype_bytes * (p.numel() // ep)
        split = p.dim() >= 2 and not any(k in pname for k in tp_whole)
        return dtype_bytes * (p.numel() // tp if split else p.numel())

    sizes = unit_param_bytes(model, [u.name for u in declared] + [""], size_of)
    units = [replace(u, param_bytes=sizes[u.name]) for u in declared if sizes[u.name] > 0]
    if sizes[""] > 0:
        units.append(FsdpUnit("", sizes[""]))
    return units


def apply_data_parallel(
    model: nn.Module, dims: ParallelDims, plan: PartPlan, implementation: str, precision: Precision
) -> None:
    """FSDP2 / HSDP / DDP / SimpleFSDP (`implementation`: parallelism.fsdp_implementation) on
    one model part, each unit as `plan` says, on the data-parallel mesh of its kind
    (ParallelDims.dp_mesh)."""
    if implementation == "simple_fsdp":
        simple_fsdp(model, plan, dims.dp_mesh, precision.param, precision.reduce)
        return
    mp = mixed_precision(precision.param, precision.reduce)
    offload = host_offload() if precision.cpu_offload else None
    dense = dims.dp_mesh(UnitKind.DENSE)
    if dense.shard is None:
        apply_ddp(model, plan, dense, mp, offload=offload)
    else:
        apply_fsdp2(model, plan, dims.dp_mesh, mp, offload=offload)


def fsdp_ac_groups(dims: ParallelDims, implementation: str) -> frozenset[str]:
    """Process groups whose all-gathers are FSDP's inside AC regions (SimpleFSDP only):
    what fsdp_ac_policy saves or recomputes, never TP's or EP's collectives."""
    if implementation != "simple_fsdp":
        return frozenset()
    return dims.fsdp_group_names()


def reshard_after_eval(model_parts: list[nn.Module]) -> None:
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
