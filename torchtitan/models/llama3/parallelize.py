"""parallelize_llama: CP -> TP -> activation checkpointing -> torch.compile -> data parallel,
applied to one Llama3 model part (the whole model, or one pipeline stage)."""

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
    root_sharding,
)
from torchtitan.models.llama3.args import FLAVORS
from torchtitan.models.llama3.model import Transformer
from torchtitan.models.train_spec import TrainSpec


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh, loss_parallel: bool) -> None:
    """Megatron-style TP with sequence parallel: the residual stream is sharded over the
    sequence between blocks; attention and FFN gather it, split heads / hidden units
    column-wise and reduce-scatter back after the row-wise output projection."""
    parallelize_module(model, tp_mesh, root_sharding(model, loss_parallel))
    model.sequence_shards = tp_mesh.size()  # blocks see 1/tp of the tokens between them
    for block in model.layers.values():
        parallelize_module(
            block,
            tp_mesh,
            {
                "attention_norm": SequenceParallel(),
                **gqa_sharding(block, "attention"),
                "ffn_norm": SequenceParallel(),
                **feed_forward_sharding(block, "feed_forward"),
            },
        )


def parallelize_llama(
    model: nn.Module,
    dims: ParallelDims,
    plan: PartPlan,
    parallelism: Parallelism,
    compile_cfg: Compile,
    *,
    precision: Precision,
) -> nn.Module:
    return parallelize_decoder(
        model, dims, plan, parallelism, compile_cfg, precision=precision, apply_tp=apply_tp
    )


# TP splits every weight matrix (see apply_tp) and replicates the norm vectors.
TRAIN_SPEC = TrainSpec("llama3", Transformer, FLAVORS, parallelize_llama)
