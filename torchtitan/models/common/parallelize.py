"""The order every decoder model's parallelize function applies to one model part: context
parallel -> the model's own TP sharding -> expert parallel -> activation checkpointing ->
torch.compile -> data parallel. A model passes only what is its own (its `apply_tp`, whether
the part has MoE blocks, which module lists compile)."""

from collections.abc import Callable

from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from torchtitan.config.job_config import Compile, Parallelism
from torchtitan.distributed.activation_checkpoint import apply_ac
from torchtitan.distributed.compile import apply_compile, configure_compile_passes
from torchtitan.distributed.context_parallel import apply_context_parallel
from torchtitan.distributed.data_parallel import Precision, apply_data_parallel, fsdp_ac_groups
from torchtitan.distributed.expert_parallel import SAC_SAVE_OPS, expert_parallel_from_plan
from torchtitan.distributed.parallel_dims import ParallelDims
from torchtitan.distributed.plan import PartPlan
from torchtitan.models.common.moe import moe_modules


def parallelize_decoder(
    model: nn.Module,
    dims: ParallelDims,
    plan: PartPlan,
    parallelism: Parallelism,
    compile_cfg: Compile,
    *,
    precision: Precision,
    apply_tp: Callable[[nn.Module, DeviceMesh, bool], None],
    moe: bool = False,
    compiled: tuple[str, ...] = ("layers",),
) -> nn.Module:
    """`plan` (units with their reshard decisions and AC regions) was resolved beforehand.
    `moe`: the part has MoE blocks. Op SAC then also keeps the outputs of expert parallel's
    all-to-alls and their waits (recompute neither re-routes nor re-sends). Every block
    compiles as one graph (fullgraph, MoE dispatch and experts included), but for a block
    holding an FSDP2 / DDP unit (`hooked_blocks`: docs/compile.md).
    `compiled`: the model's ModuleDicts of blocks to compile."""
    cp_groups = apply_context_parallel(model, dims)
    tp_mesh = dims.tp_mesh()
    if tp_mesh is not None:
        apply_tp(model, tp_mesh, parallelism.loss_parallel)
    ep_mesh = dims.ep_mesh()
    if ep_mesh is not None:  # each MoE layer's dispatcher becomes an all-to-all over the EP group
        expert_parallel_from_plan(model, plan, ep_mesh)
    apply_ac(
        model,
        plan.regions,
        fsdp_ac_groups(dims, parallelism.fsdp_implementation),
        extra_save_ops=SAC_SAVE_OPS if moe else (),
        save_groups=cp_groups,
    )
    if compile_cfg.enable and "model" in compile_cfg.components:
        configure_compile_passes(compile_cfg, parallelism, tp_mesh)  # graph passes, async TP
        hooked = hooked_blocks(plan, parallelism.fsdp_implementation)
        for block in hooked:  # their dispatch runs outside the graph: one break, no recompiles
            for layer in moe_modules(model.get_submodule(block)):
                layer.dispatch_in_graph = False
        for name in compiled:
            if getattr(model, name, None) is not None:
                apply_compile(getattr(model, name), compile_cfg, name=name, hooked=hooked)
    apply_data_parallel(model, dims, plan, parallelism.fsdp_implementation, precision)
    return model


def hooked_blocks(plan: PartPlan, fsdp_implementation: str) -> frozenset[str]:
    """Blocks that cannot compile as one graph: those holding an FSDP unit of their own (a
    MoE block's experts) whose hooks dynamo does not trace. FSDP2 and DDP (FSDP2's
    machinery): torch 2.13 wraps their hooks in `torch._dynamo.disable`. SimpleFSDP's unit
    input traces (a nested unit costs no break: DeepSeek-V3 EP2, every AC mode, 0 graph
    breaks), but under PP a unit gathered once per step keeps its state in Python (eager)."""
    nested = frozenset(u.block for u in plan.units if u.block is not None and u.name != u.block)
    if fsdp_implementation == "simple_fsdp" and plan.microbatches <= 1:
        return frozenset()
    return nested
