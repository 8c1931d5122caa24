"""TP shardings (parallelize_module layouts) shared by the decoder models: the root
(embeddings, final norm, output) and a SwiGLU feed-forward, Megatron-style with sequence
parallel between blocks."""

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
)


def root_sharding(model, loss_parallel: bool) -> dict:
    """Embeddings row-wise (output sharded over the sequence), final norm sequence-parallel,
    output column-wise (logits sharded over the vocabulary for the loss-parallel loss)."""
    sharding = {}
    if model.tok_embeddings is not None:
        sharding["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
    if model.norm is not None:
        sharding["norm"] = SequenceParallel()
    if model.output is not None:
        sharding["output"] = ColwiseParallel(
            input_layouts=Shard(1),
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        )
    return sharding


def feed_forward_sharding(name: str) -> dict:
    """A SwiGLU feed-forward at `name`: the sequence gathered in, hidden units split, the
    output reduce-scattered back over the sequence."""
    return {
        name: PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        f"{name}.w1": ColwiseParallel(),
        f"{name}.w2": RowwiseParallel(output_layouts=Shard(1)),
        f"{name}.w3": ColwiseParallel(),
    }
