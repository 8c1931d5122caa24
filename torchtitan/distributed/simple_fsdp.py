"""SimpleFSDP: data parallelism as ordinary ops inside the module's forward.

Each parameter is stored as a DTensor sharded over the data-parallel mesh (with TP, on the
2-D (dp_shard, tp) mesh, laid out like FSDP2's so a dp all-gather yields the TP shard).
Reading `module.weight` inside forward runs `_GatherParam`: cast to the param dtype, then a
functional all-gather over dp_shard; its backward reduce-scatters (and, for HSDP / DDP,
all-reduces over dp_replicate) the gradient in the reduce dtype, averaged over the data-
parallel ranks. The gathered value is exposed through a property on a per-module subclass,
so `_parameters`, state dicts and DCP keep the original names and the sharded DTensors.

Because the gather is an op inside forward, activation checkpointing and torch.compile
see it: activation_checkpoint.py decides per region whether it is saved or recomputed
(reshard_after_forward and fsdp_ac_policy), recognising it by its process group.
"""

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.placement_types import _StridedShard

from torchtitan.distributed.fsdp import DTYPES

_fc = torch.ops._c10d_functional


class _GatherParam(torch.autograd.Function):
    """local shard -> full (dp-gathered) tensor in param dtype; grad -> averaged shard."""

    @staticmethod
    def forward(ctx, local, spec):
        ctx.spec, ctx.in_dtype = spec, local.dtype
        x = local.to(spec.param_dtype)
        if spec.shard_group is None:
            return x
        out = _fc.all_gather_into_tensor(x.contiguous(), spec.shard_size, spec.shard_group)
        return _fc.wait_tensor(out)

    @staticmethod
    def backward(ctx, grad):
        spec = ctx.spec
        g = grad.to(spec.reduce_dtype) * spec.grad_scale
        if spec.shard_group is not None:
            g = _fc.wait_tensor(_fc.reduce_scatter_tensor(g.contiguous(), "sum", spec.shard_size, spec.shard_group))
        if spec.replicate_group is not None:
            g = _fc.wait_tensor(_fc.all_reduce(g, "sum", spec.replicate_group))
        return g.to(ctx.in_dtype), None


class _GatherSpec:
    def __init__(self, shard_group, shard_size, replicate_group, dp_size, param_dtype, reduce_dtype, tp_mesh, tp_placements, shape, stride):
        self.shard_group, self.shard_size, self.replicate_group = shard_group, shard_size, replicate_group
        self.grad_scale = 1.0 / dp_size
        self.param_dtype, self.reduce_dtype = param_dtype, reduce_dtype
        self.tp_mesh, self.tp_placements, self.shape, self.stride = tp_mesh, tp_placements, shape, stride

    def gather(self, param: nn.Parameter) -> torch.Tensor:
        full = _GatherParam.apply(param.to_local(), self)
        if self.tp_mesh is None:
            return full
        return DTensor.from_local(full, self.tp_mesh, self.tp_placements, run_check=False,
                                  shape=self.shape, stride=self.stride)


def _dp_placement(tp_placement, tp_size: int):
    # A parameter TP already split on dim 0 is split again on dim 0 for dp in TP-major order,
    # so that gathering over dp yields exactly this rank's TP shard.
    if isinstance(tp_placement, Shard) and tp_placement.dim == 0:
        return _StridedShard(0, split_factor=tp_size)
    return Shard(0)


def _shard_param(param: nn.Parameter, mesh: DeviceMesh, dp_dims: list[str], shard: bool) -> tuple[nn.Parameter, list]:
    """A meta parameter (plain, or a TP DTensor) -> a DTensor on dp dims (+ tp)."""
    if isinstance(param, DTensor):
        tp_mesh, tp_placements, local = param.device_mesh, list(param.placements), param.to_local()
        full_mesh = mesh[(*dp_dims, tp_mesh.mesh_dim_names[0])]
    else:
        tp_mesh, tp_placements, local = None, [], param.data
        full_mesh = mesh[tuple(dp_dims)] if len(dp_dims) > 1 else mesh[dp_dims[0]]
    placements = [Replicate()] * len(dp_dims)
    if shard:
        shard_coord = full_mesh.get_local_rank(dp_dims.index("dp_shard"))
        shard_size = full_mesh.size(dp_dims.index("dp_shard"))
        if local.shape[0] % shard_size:
            raise ValueError(
                f"simple_fsdp: a parameter of shape {tuple(param.shape)} has dim 0 = {local.shape[0]} (this TP"
                f" rank) not divisible by data_parallel_shard_degree={shard_size}; use fsdp2 or another degree"
            )
        tp_size = tp_mesh.size() if tp_mesh is not None else 1
        placements[dp_dims.index("dp_shard")] = _dp_placement(tp_placements[0] if tp_placements else None, tp_size)
        local = local.chunk(shard_size, dim=0)[shard_coord]
    dt = DTensor.from_local(local, full_mesh, placements + tp_placements, run_check=False,
                            shape=param.shape, stride=param.stride())
    return nn.Parameter(dt, requires_grad=param.requires_grad), tp_placements


def simple_fsdp(model: nn.Module, mesh: DeviceMesh, dp_dims: list[str], param_dtype: str, reduce_dtype: str) -> nn.Module:
    """Turn every parameter of `model` (on meta) into a SimpleFSDP parameter, in place.

    dp_dims: ["dp_shard"] (FSDP), ["dp_replicate", "dp_shard"] (HSDP) or ["dp_replicate"] (DDP).
    """
    shard = "dp_shard" in dp_dims
    shard_group = mesh["dp_shard"].get_group().group_name if shard else None
    shard_size = mesh["dp_shard"].size() if shard else 1
    replicate_group = mesh["dp_replicate"].get_group().group_name if "dp_replicate" in dp_dims else None
    dp_size = shard_size * (mesh["dp_replicate"].size() if replicate_group else 1)
    for module in list(model.modules()):
        names = [n for n, p in module._parameters.items() if p is not None]
        if not names:
            continue
        specs = {}
        for name in names:
            param = module._parameters[name]
            new_param, tp_placements = _shard_param(param, mesh, dp_dims, shard)
            specs[name] = _GatherSpec(
                shard_group, shard_size, replicate_group, dp_size, DTYPES[param_dtype], DTYPES[reduce_dtype],
                param.device_mesh if isinstance(param, DTensor) else None, tp_placements,
                param.shape, param.stride(),
            )
            module._parameters[name] = new_param
        module._simple_fsdp_specs = specs
        cls = module.__class__
        props = {n: property(lambda self, n=n: self._simple_fsdp_specs[n].gather(self._parameters[n])) for n in names}
        module.__class__ = type(f"SimpleFSDP{cls.__name__}", (cls,), props)
    return model


def fsdp_group_names(mesh: DeviceMesh, dp_dims: list[str]) -> set[str]:
    """Process groups whose collectives are SimpleFSDP's (what SAC policies recognise)."""
    return {mesh[d].get_group().group_name for d in dp_dims}
