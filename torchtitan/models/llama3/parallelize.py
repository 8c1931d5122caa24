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

from torchtitan.distributed.activation_checkpoint import apply_ac
from torchtitan.distributed.compile import apply_compile
from torchtitan.distributed.data_parallel import apply_data_parallel, build_units, fsdp_ac_groups
from torchtitan.distributed.reshard_policy import Unit
from torchtitan.models.common.tensor_parallel import feed_forward_plan, root_plan


def fsdp_units(model: nn.Module, dims, dtype_bytes: int) -> list[Unit]:
    """TP splits every weight matrix (see apply_tp) and replicates the norm vectors."""
    return build_units(model, dims.tp, dims.ep, dtype_bytes)


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh, loss_parallel: bool) -> None:
    """Megatron-style TP with sequence parallel: the residual stream is sharded over the
    sequence between blocks; attention and FFN gather it, split heads / hidden units
    column-wise and reduce-scatter back after the row-wise output projection."""
    parallelize_module(model, tp_mesh, root_plan(model, loss_parallel))
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, {
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)),
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            **feed_forward_plan("feed_forward"),
        })


def parallelize_llama(model: nn.Module, dims, cfg, param_dtype: str, plan) -> nn.Module:
    """`plan` (a ModelPart: units, reshard decisions, AC regions) was resolved beforehand."""
    tp_mesh = dims.submesh("tp")
    if tp_mesh is not None:
        apply_tp(model, tp_mesh, cfg.parallelism.loss_parallel)
    apply_ac(model, plan.regions, fsdp_ac_groups(dims, cfg))
    if cfg.compile.enable:
        apply_compile(model.layers, cfg.compile)
    apply_data_parallel(model, dims, cfg, param_dtype, plan)
    return model
