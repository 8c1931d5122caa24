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

from dataclasses import dataclass

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


@dataclass(frozen=True)
class _GatherSpec:
    """How one parameter is gathered for forward and its gradient reduced."""

    shard_group: str | None  # all-gather / reduce-scatter group (None: nothing to gather)
    shard_size: int
    replicate_group: str | None  # HSDP / DDP: gradients all-reduced over it
    grad_scale: float  # 1 / every data-parallel rank (experts too: EP already summed their tokens)
    param_dtype: torch.dtype
    reduce_dtype: torch.dtype
    tp_mesh: DeviceMesh | None  # the model-parallel (TP or EP) mesh a gathered value lives on
    tp_placements: tuple
    shape: torch.Size
    stride: tuple

    def gather(self, param: nn.Parameter) -> torch.Tensor:
        full = _GatherParam.apply(param.to_local(), self)
        if self.tp_mesh is None:
            return full
        return DTensor.from_local(full, self.tp_mesh, list(self.tp_placements), run_check=False,
                                  shape=self.shape, stride=self.stride)


def _dp_placement(tp_placement, tp_size: int):
    # A parameter TP already split on dim 0 is split again on dim 0 for dp in TP-major order,
    # so that gathering over dp yields exactly this rank's TP shard.
    if isinstance(tp_placement, Shard) and tp_placement.dim == 0:
        return _StridedShard(0, split_factor=tp_size)
    return Shard(0)


def _shard_param(param: nn.Parameter, mesh: DeviceMesh, dims: list[str], shard_dim: str | None) -> nn.Parameter:
    """A meta parameter (plain, or a TP / EP DTensor) -> a DTensor on the data-parallel dims
    (+ its model-parallel dim), sharded on dim 0 over `shard_dim` when there is one."""
    if isinstance(param, DTensor):
        tp_mesh, tp_placements, local = param.device_mesh, list(param.placements), param.to_local()
        full_mesh = mesh[(*dims, tp_mesh.mesh_dim_names[0])]
    else:
        tp_mesh, tp_placements, local = None, [], param.data
        full_mesh = mesh[tuple(dims)] if len(dims) > 1 else mesh[dims[0]]
    placements = [Replicate()] * len(dims)
    if shard_dim is not None:
        shard_coord = full_mesh.get_local_rank(dims.index(shard_dim))
        shard_size = full_mesh.size(dims.index(shard_dim))
        if local.shape[0] % shard_size:
            what = ("data_parallel_shard_degree / (expert_parallel_degree / tensor_parallel_degree)"
                    if shard_dim == "dp_shard_mod_ep" else "data_parallel_shard_degree")
            raise ValueError(
                f"--parallelism.fsdp_implementation=simple_fsdp: a parameter of shape {tuple(param.shape)} has"
                f" dim 0 = {local.shape[0]} on this TP/EP rank, not divisible by {what} = {shard_size} (SimpleFSDP"
                " does not pad); use fsdp2 or other degrees"
            )
        tp_size = tp_mesh.size() if tp_mesh is not None else 1
        placements[dims.index(shard_dim)] = _dp_placement(tp_placements[0] if tp_placements else None, tp_size)
        local = local.chunk(shard_size, dim=0)[shard_coord]
    dt = DTensor.from_local(local, full_mesh, placements + tp_placements, run_check=False,
                            shape=param.shape, stride=param.stride())
    return nn.Parameter(dt, requires_grad=param.requires_grad)


def experts_dims(dims: list[str]) -> list[str]:
    """The data-parallel dims of routed experts under EP: what EP left of dp_shard."""
    return [d for d in dims if d == "dp_replicate"] + ["dp_shard_mod_ep"]


def simple_fsdp(
    model: nn.Module, mesh: DeviceMesh, dp_dims: list[str], param_dtype: str, reduce_dtype: str,
    experts: tuple[str, ...] = (),
) -> nn.Module:
    """Turn every parameter of `model` (on meta) into a SimpleFSDP parameter, in place.

    dp_dims: ["dp_shard"] (FSDP), ["dp_replicate", "dp_shard"] (HSDP) or ["dp_replicate"] (DDP).
    experts: submodules holding routed experts split by EP; they shard over what EP left of
    dp_shard (dp_shard_mod_ep), and their gradients are still averaged over every
    data-parallel rank.
    """
    dp_size = 1
    for d in dp_dims:
        dp_size *= mesh[d].size()

    def spec_of(param, dims: list[str], shard_dim: str | None) -> _GatherSpec:
        return _GatherSpec(
            shard_group=mesh[shard_dim].get_group().group_name if shard_dim else None,
            shard_size=mesh[shard_dim].size() if shard_dim else 1,
            replicate_group=mesh["dp_replicate"].get_group().group_name if "dp_replicate" in dims else None,
            grad_scale=1.0 / dp_size, param_dtype=DTYPES[param_dtype], reduce_dtype=DTYPES[reduce_dtype],
            tp_mesh=param.device_mesh if isinstance(param, DTensor) else None,
            tp_placements=tuple(param.placements) if isinstance(param, DTensor) else (),
            shape=param.shape, stride=param.stride(),
        )

    for module_name, module in list(model.named_modules()):
        names = [n for n, p in module._parameters.items() if p is not None]
        if not names:
            continue
        plain = module_name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")  # AC / compile
        is_experts = any(plain == e or plain.startswith(e + ".") for e in experts)
        dims = experts_dims(dp_dims) if is_experts else dp_dims
        shard_dim = ("dp_shard_mod_ep" if is_experts else "dp_shard") if "dp_shard" in dp_dims else None
        specs = {}
        for name in names:
            param = module._parameters[name]
            specs[name] = spec_of(param, dims, shard_dim)
            module._parameters[name] = _shard_param(param, mesh, dims, shard_dim)
        module._simple_fsdp_specs = specs
        cls = module.__class__
        props = {n: property(lambda self, n=n: self._simple_fsdp_specs[n].gather(self._parameters[n])) for n in names}
        module.__class__ = type(f"SimpleFSDP{cls.__name__}", (cls,), props)
    return model


def fsdp_group_names(mesh: DeviceMesh, dp_dims: list[str], experts: bool = False) -> set[str]:
    """Process groups whose collectives are SimpleFSDP's (what SAC policies recognise): the
    data-parallel dims, and with experts under EP also theirs."""
    dims = set(dp_dims) | (set(experts_dims(dp_dims)) if experts else set())
    return {mesh[d].get_group().group_name for d in dims}
