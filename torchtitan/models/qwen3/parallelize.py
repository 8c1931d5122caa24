"""parallelize_qwen3: CP -> TP -> expert parallel -> activation checkpointing -> torch.compile
-> data parallel, applied to one Qwen3 model part (the whole model, or one pipeline stage).

Every step is shared: Llama3's attention sharding (with QK-norm weights replicated, their
gradients summed over TP), DeepSeek-V3's MoE sharding and expert parallel, and the framework's
AC / compile / FSDP. The tied output head is re-tied after TP (which gives each module its
own DTensor parameter) so the root FSDP unit holds one parameter for both uses.
"""

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import SequenceParallel, parallelize_module

from torchtitan.config.job_config import Compile, Parallelism
from torchtitan.distributed.data_parallel import Precision
from torchtitan.distributed.parallel_dims import ParallelDims
from torchtitan.distributed.plan import PartPlan
from torchtitan.models.common.parallelize import parallelize_decoder
from torchtitan.models.common.tensor_parallel import (
    feed_forward_sharding,
    gqa_sharding,
    moe_sharding,
    root_sharding,
    split_moe_tokens,
)
from torchtitan.models.common.tied import retie
from torchtitan.models.qwen3.args import FLAVORS
from torchtitan.models.qwen3.model import Transformer
from torchtitan.models.train_spec import TrainSpec

# Modules TP keeps whole: the per-head q/k norms (one head_dim weight) and the router.
_TP_WHOLE = ("attention.q_norm.", "attention.k_norm.", "moe.router.")


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh, loss_parallel: bool) -> None:
    """Sequence parallel between blocks (as Llama3); heads split in attention, hidden units in
    the dense FFN; MoE blocks route each rank's own tokens."""
    parallelize_module(model, tp_mesh, root_sharding(model, loss_parallel))
    retie(model)  # embeddings row-wise and output column-wise are both Shard(0) of [vocab, dim]
    model.sequence_shards = tp_mesh.size()
    split_moe_tokens(model, tp_mesh)  # the balance statistics are summed over TP
    for block in model.layers.values():
        ffn = (
            moe_sharding(block, "moe")
            if block.moe_enabled
            else feed_forward_sharding(block, "feed_forward")
        )
        parallelize_module(
            block,
            tp_mesh,
            {
                "attention_norm": SequenceParallel(),
                **gqa_sharding(block, "attention", qk_norm=True),
                "ffn_norm": SequenceParallel(),
                **ffn,
            },
        )


def parallelize_qwen3(
    model: nn.Module,
    dims: ParallelDims,
    plan: PartPlan,
    parallelism: Parallelism,
    compile_cfg: Compile,
    *,
    precision: Precision,
) -> nn.Module:
    moe = any(block.moe_enabled for block in model.layers.values())  # this part's blocks
    return parallelize_decoder(
        model, dims, plan, parallelism, compile_cfg, precision=precision, apply_tp=apply_tp, moe=moe
    )


TRAIN_SPEC = TrainSpec("qwen3", Transformer, FLAVORS, parallelize_qwen3, tp_replicated=_TP_WHOLE)
