"""parallelize_deepseekv3: CP -> TP -> expert parallel -> activation checkpointing -> torch.compile
-> data parallel, applied to one DeepSeek-V3 model part (the whole model, or one stage).

Everything but the TP sharding is the shared machinery Llama3 uses (expert parallel reads
the plan: each routed-experts unit's parent, the MoE layer, gets the all-to-all dispatcher).
"""

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    PrepareModuleInput,
    SequenceParallel,
    parallelize_module,
)

from torchtitan.config.job_config import Compile, Parallelism
from torchtitan.distributed.data_parallel import Precision
from torchtitan.distributed.parallel_dims import ParallelDims
from torchtitan.distributed.plan import PartPlan
from torchtitan.distributed.tensor_parallel import ReplicateParallel
from torchtitan.models.common.float8 import float8_tp_styles
from torchtitan.models.common.parallelize import parallelize_decoder
from torchtitan.models.common.tensor_parallel import (
    feed_forward_sharding,
    moe_sharding,
    root_sharding,
    split_moe_tokens,
)
from torchtitan.models.deepseek_v3.args import FLAVORS
from torchtitan.models.deepseek_v3.model import Transformer
from torchtitan.models.train_spec import TrainSpec

# Modules TP keeps whole: MLA's LoRA down-projections (their outputs are small and feed the
# norms before the head-split up-projections), the router and MTP's input projection.
_TP_WHOLE = ("attention.wq_a.", "attention.wkv_a.", "moe.router.", "eh_proj.")


def block_sharding(block: nn.Module) -> dict:
    """The TP layout of one transformer block (a main block or an MTP module's): sequence
    parallel norms; MLA's LoRA down-projections and their norms replicated, up-projections
    column-wise (heads split), output row-wise; dense FFN and shared experts column/row-wise.
    Routed experts are not TP-split: under sequence parallel each TP rank routes its own
    tokens, and EP (which includes the TP ranks) moves them to their experts. Float8 linears
    (tensorwise) take torchao's styles; attention's input is gathered in high precision, as
    the replicated down-projections read it whole."""
    attn = block.attention
    q_split = "wq" if getattr(attn, "wq", None) is not None else "wq_b"
    s = float8_tp_styles([attn.wkv_b, attn.wo, getattr(attn, q_split)])
    sharding = {
        "attention_norm": SequenceParallel(),
        "attention": PrepareModuleInput(
            input_layouts=(Shard(1), None),
            desired_input_layouts=(Replicate(), None),
            use_local_output=True,
        ),
        "attention.wkv_a": ReplicateParallel(),
        "attention.kv_norm": ReplicateParallel(),
        "attention.shared_key": ReplicateParallel(partial_output_grad=True),
        "attention.wkv_b": s.colwise(),
        "attention.wo": s.rowwise(output_layouts=Shard(1)),
        f"attention.{q_split}": s.colwise(),
        "ffn_norm": SequenceParallel(),
    }
    if q_split == "wq_b":
        sharding["attention.wq_a"] = ReplicateParallel()
        sharding["attention.q_norm"] = ReplicateParallel()
    if block.moe_enabled:
        sharding.update(moe_sharding(block, "moe", block.moe.shared_experts is not None))
    else:
        sharding.update(feed_forward_sharding(block, "feed_forward"))
    return sharding


# An MTP module around its block: both of its inputs arrive split over the sequence (the last
# block's output, the embeddings' reduce-scatter), so its norms are sequence parallel and
# eh_proj, kept whole, runs on each rank's own tokens (its gradient summed over TP); the block
# leaves its output split as every block does, and `norm` feeds the shared output head.
_MTP_SHARDING = {
    "enorm": SequenceParallel(),
    "hnorm": SequenceParallel(),
    "eh_proj": ReplicateParallel(input_layout=Shard(1)),
    "norm": SequenceParallel(),
}


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh, loss_parallel: bool) -> None:
    """Sequence parallel between blocks as in Llama3; every block (the MTP modules' too) as
    `block_sharding` says."""
    parallelize_module(model, tp_mesh, root_sharding(model, loss_parallel))
    model.sequence_shards = tp_mesh.size()  # blocks see 1/tp of the tokens between them
    split_moe_tokens(model, tp_mesh)  # the balance statistics are summed over TP
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, block_sharding(block))
    for module in (model.mtp or {}).values():
        parallelize_module(module.block, tp_mesh, block_sharding(module.block))
        parallelize_module(module, tp_mesh, dict(_MTP_SHARDING))


def parallelize_deepseekv3(
    model: nn.Module,
    dims: ParallelDims,
    plan: PartPlan,
    parallelism: Parallelism,
    compile_cfg: Compile,
    *,
    precision: Precision,
) -> nn.Module:
    return parallelize_decoder(
        model,
        dims,
        plan,
        parallelism,
        compile_cfg,
        precision=precision,
        apply_tp=apply_tp,
        moe=True,
        compiled=("layers", "mtp"),
    )


TRAIN_SPEC = TrainSpec(
    "deepseek_v3", Transformer, FLAVORS, parallelize_deepseekv3, tp_replicated=_TP_WHOLE
)
