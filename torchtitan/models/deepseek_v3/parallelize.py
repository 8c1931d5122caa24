"""parallelize_deepseekv3: TP -> expert parallel -> activation checkpointing -> torch.compile
-> data parallel, applied to one DeepSeek-V3 model part (the whole model, or one stage).

Everything but the TP plan and the expert split is the shared machinery Llama3 uses.
"""

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
from torchtitan.distributed.expert_parallel import SAC_SAVE_OPS, apply_expert_parallel
from torchtitan.distributed.reshard_policy import Unit
from torchtitan.distributed.tensor_parallel import ReplicateParallel
from torchtitan.models.common.tensor_parallel import feed_forward_plan, root_plan

# Modules TP keeps whole: MLA's LoRA down-projections (their outputs are small and feed the
# norms before the head-split up-projections) and the router.
_TP_WHOLE = ("attention.wq_a.", "attention.wkv_a.", "moe.router.")


def fsdp_units(model: nn.Module, dims, dtype_bytes: int) -> list[Unit]:
    return build_units(model, dims.tp, dims.ep, dtype_bytes, tp_whole=lambda name: any(k in name for k in _TP_WHOLE))


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh, loss_parallel: bool) -> None:
    """Sequence parallel between blocks as in Llama3. MLA: LoRA down-projections and their
    norms replicated, up-projections column-wise (heads split), output row-wise. Dense FFN
    and shared experts column/row-wise. Routed experts are not TP-split: under sequence
    parallel each TP rank routes its own tokens, and EP (which includes the TP ranks) moves
    them to their experts."""
    parallelize_module(model, tp_mesh, root_plan(model, loss_parallel))
    for block in model.layers.values():
        attn = block.attention
        plan = {
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None),
                                            use_local_output=True),
            "attention.wkv_a": ReplicateParallel(),
            "attention.kv_norm": ReplicateParallel(),
            "attention.shared_key": ReplicateParallel(partial_output_grad=True),
            "attention.wkv_b": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
        }
        if getattr(attn, "wq", None) is not None:
            plan["attention.wq"] = ColwiseParallel()
        else:
            plan.update({"attention.wq_a": ReplicateParallel(), "attention.q_norm": ReplicateParallel(),
                         "attention.wq_b": ColwiseParallel()})
        if block.moe_enabled:
            plan.update({
                # Each TP rank keeps its own tokens: the router's gradient is summed over TP.
                "moe": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Shard(1),),
                                          use_local_output=True),
                "moe.router.gate": ReplicateParallel(input_layout=Shard(0)),
            })
            if block.moe.shared_experts is not None:
                plan.update(feed_forward_plan("moe.shared_experts"))
        else:
            plan.update(feed_forward_plan("feed_forward"))
        parallelize_module(block, tp_mesh, plan)


def apply_ep(model: nn.Module, ep_mesh: DeviceMesh) -> None:
    for block in model.layers.values():
        if block.moe_enabled:
            apply_expert_parallel(block.moe.experts, ep_mesh)


def parallelize_deepseekv3(model: nn.Module, dims, cfg, param_dtype: str, plan) -> nn.Module:
    """`plan` (a ModelPart: units, reshard decisions, AC regions) was resolved beforehand."""
    tp_mesh = dims.submesh("tp")
    if tp_mesh is not None:
        apply_tp(model, tp_mesh, cfg.parallelism.loss_parallel)
    if dims.ep > 1:
        apply_ep(model, dims.submesh("ep"))
    # Op SAC also keeps the dispatched tokens: recompute then neither re-routes nor re-sends.
    apply_ac(model, plan.regions, fsdp_ac_groups(dims, cfg), extra_save_ops=SAC_SAVE_OPS)
    if cfg.compile.enable:
        apply_compile(model.layers, cfg.compile, fullgraph=False)  # MoE dispatch + experts stay eager
    apply_data_parallel(model, dims, cfg, param_dtype, plan)
    return model
