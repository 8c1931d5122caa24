"""parallelize_llama: TP -> activation checkpointing -> torch.compile -> data parallel,
applied to one Llama3 model part (the whole model, or one pipeline stage)."""

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from torchtitan.config.job_config import JobConfig
from torchtitan.distributed.activation_checkpoint import apply_ac
from torchtitan.distributed.compile import apply_compile
from torchtitan.distributed.fsdp import apply_ddp, apply_fsdp2, mixed_precision, unit_param_bytes
from torchtitan.distributed.parallel_dims import ParallelDims
from torchtitan.distributed.model_parts import PartPlan
from torchtitan.distributed.reshard_policy import Unit
from torchtitan.distributed.simple_fsdp import fsdp_group_names, simple_fsdp


def fsdp_units(model: nn.Module, tp: int, dtype_bytes: int) -> list[Unit]:
    """FSDP units of a model part in forward order, with the unsharded bytes one rank holds:
    the embeddings, each block, then the root (final norm + output). TP splits every weight
    matrix (see apply_tp) and replicates the norm vectors."""
    names = (["tok_embeddings"] if model.tok_embeddings is not None else [])
    names += [f"layers.{name}" for name in model.layers.keys()] + [""]
    sizes = unit_param_bytes(model, names, lambda p: dtype_bytes * (p.numel() // tp if p.dim() >= 2 else p.numel()))
    return [Unit(name, sizes[name], is_root=name == "") for name in names if sizes[name] > 0]


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh, loss_parallel: bool) -> None:
    """Megatron-style TP with sequence parallel: the residual stream is sharded over the
    sequence between blocks; attention and FFN gather it, split heads / hidden units
    column-wise and reduce-scatter back after the row-wise output projection."""
    root_plan = {}
    if model.tok_embeddings is not None:
        root_plan["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
    if model.norm is not None:
        root_plan["norm"] = SequenceParallel()
    if model.output is not None:
        root_plan["output"] = ColwiseParallel(
            input_layouts=Shard(1),
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        )
    parallelize_module(model, tp_mesh, root_plan)
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, {
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)),
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
            "feed_forward.w3": ColwiseParallel(),
        })


def parallelize_llama(
    model: nn.Module, parallel_dims: ParallelDims, job_config: JobConfig, param_dtype: str, plan: PartPlan,
) -> nn.Module:
    """`plan` (reshard decisions and AC regions) was resolved for this part beforehand."""
    tp_mesh = parallel_dims.submesh("tp")
    if tp_mesh is not None:
        apply_tp(model, tp_mesh, job_config.parallelism.loss_parallel)

    simple = job_config.parallelism.fsdp_implementation == "simple_fsdp"
    mesh, dp_dims = parallel_dims.mesh, parallel_dims.dp_dims()
    apply_ac(model, plan.regions, frozenset(fsdp_group_names(mesh, dp_dims)) if simple else frozenset())

    if job_config.compile.enable:
        apply_compile(model.layers, job_config.compile)

    reduce_dtype = job_config.training.mixed_precision_reduce
    if simple:
        simple_fsdp(model, mesh, dp_dims, param_dtype, reduce_dtype)
    elif dp_dims == ["dp_replicate"]:
        apply_ddp(model, mesh["dp_replicate"], mixed_precision(param_dtype, reduce_dtype), list(plan.reshard))
    else:
        apply_fsdp2(model, parallel_dims.submesh("fsdp"), mixed_precision(param_dtype, reduce_dtype), plan.reshard_flags)
    return model
