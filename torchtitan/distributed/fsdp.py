"""Apply FSDP2 (`fully_shard`) unit by unit, as the resharding plan says.

Each FSDP unit (a submodule name, or "" for the root that holds whatever no unit took:
final norm, output, ...) comes with its mesh and its reshard_after_forward. On a 2-D mesh
(dp_replicate, dp_shard) fully_shard is HSDP.
"""

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def mixed_precision(param: str, reduce: str) -> MixedPrecisionPolicy:
    return MixedPrecisionPolicy(param_dtype=DTYPES[param], reduce_dtype=DTYPES[reduce])


def inner_first(units: list[tuple]) -> list[tuple]:
    """The named units (tuples starting with the name; the root "" left out) with nested ones
    (experts) before the units containing them, forward order otherwise: wrapping a block
    first would make its experts' parameters the block's."""
    named = [u for u in units if u[0]]
    nested = {u[0] for u in named if any(u[0].startswith(o[0] + ".") for o in named)}
    return sorted(named, key=lambda u: u[0] not in nested)  # stable


def apply_fsdp2(
    model: nn.Module, mesh: DeviceMesh, units: list[tuple[str, DeviceMesh, bool]], mp: MixedPrecisionPolicy,
    experts_divide_factor: float | None = None, experts: frozenset[str] | set[str] = frozenset(),
) -> None:
    """fully_shard every (name, mesh, reshard_after_forward) unit, nested ones (experts)
    before the units that contain them, then the root ("") on `mesh`."""
    root_reshard = next((reshard for name, _, reshard in units if name == ""), False)
    for name, unit_mesh, reshard in inner_first(units):
        module = fully_shard(model.get_submodule(name), mesh=unit_mesh, mp_policy=mp, reshard_after_forward=reshard)
        if name in experts and experts_divide_factor is not None:
            # Divide by every data-parallel rank, not by the experts' mesh. FSDP2 (torch 2.13)
            # then reduce-scatters with PREMUL_SUM, which gloo lacks: forcing SUM moves the
            # division after it. But with a shard group of size 1 it skips the reduce-scatter,
            # divides by the factor itself, and with SUM forced would divide a second time.
            module.set_gradient_divide_factor(float(experts_divide_factor))
            if unit_mesh.size(unit_mesh.ndim - 1) > 1:
                module.set_force_sum_reduction_for_comms(True)
    # The root's value is set explicitly: FSDP2 would otherwise reshard it after forward too.
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=root_reshard)


def apply_ddp(model: nn.Module, mesh: DeviceMesh, mp: MixedPrecisionPolicy, units: list[str]) -> None:
    """Replicate (DDP semantics, FSDP2 machinery): one gradient all-reduce per unit."""
    from torch.distributed._composable.replicate_with_fsdp import replicate

    for (name,) in inner_first([(u,) for u in units]):
        replicate(model.get_submodule(name), mesh=mesh, mp_policy=mp)
    replicate(model, mesh=mesh, mp_policy=mp)


def unit_param_bytes(model: nn.Module, unit_names: list[str], size_of) -> dict[str, int]:
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
