"""Apply FSDP2 (`fully_shard`) unit by unit, as the resharding plan says.

A plan maps each FSDP unit (a submodule name, or "" for the root that holds whatever no
unit took: embeddings, final norm, output) to its reshard_after_forward. On a 2-D mesh
(dp_replicate, dp_shard) fully_shard is HSDP.
"""

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def mixed_precision(param: str, reduce: str) -> MixedPrecisionPolicy:
    return MixedPrecisionPolicy(param_dtype=DTYPES[param], reduce_dtype=DTYPES[reduce])


def apply_fsdp2(model: nn.Module, mesh: DeviceMesh, mp: MixedPrecisionPolicy, plan: dict[str, bool]) -> None:
    """fully_shard every unit of `plan` (innermost first), then the root."""
    for name, reshard in plan.items():
        if name:
            fully_shard(model.get_submodule(name), mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
    # The root's value is set explicitly: FSDP2 would otherwise reshard it after forward too.
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=plan.get("", False))


def apply_ddp(model: nn.Module, mesh: DeviceMesh, mp: MixedPrecisionPolicy, units: list[str]) -> None:
    """Replicate (DDP semantics, FSDP2 machinery): one gradient all-reduce per unit."""
    from torch.distributed._composable.replicate_with_fsdp import replicate

    for name in units:
        if name:
            replicate(model.get_submodule(name), mesh=mesh, mp_policy=mp)
    replicate(model, mesh=mesh, mp_policy=mp)


def unit_param_bytes(model: nn.Module, unit_names: list[str], size_of) -> dict[str, int]:
    """Bytes of the parameters each unit owns directly (nested units excluded; "" is the
    root), with `size_of(param) -> bytes` saying what one parameter costs on this rank."""
    owner = {}
    for unit in sorted(unit_names, key=len):  # outer units first, inner ones overwrite
        prefix = f"{unit}." if unit else ""
        for name, _ in model.named_parameters():
            if name.startswith(prefix):
                owner[name] = unit
    sizes = dict.fromkeys(unit_names, 0)
    for name, p in model.named_parameters():
        sizes[owner[name]] += size_of(p)
    return sizes
