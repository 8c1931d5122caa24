"""TP shardings (parallelize_module layouts) shared by the decoder models: the root
(embeddings, final norm, output), grouped-query attention and a SwiGLU feed-forward, Megatron-style with sequence
parallel between blocks."""

from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
)

from torchtitan.distributed.tensor_parallel import ReplicateParallel
from torchtitan.models.common.float8 import float8_tp_styles
from torchtitan.models.common.moe import moe_modules


def root_sharding(model, loss_parallel: bool) -> dict:
    """Embeddings row-wise (output sharded over the sequence), final norm sequence-parallel,
    output column-wise (logits sharded over the vocabulary for the loss-parallel loss)."""
    sharding = {}
    if model.tok_embeddings is not None:
        sharding["tok_embeddings"] = RowwiseParallel(
            input_layouts=Replicate(), output_layouts=Shard(1)
        )
    if model.norm is not None:
        sharding["norm"] = SequenceParallel()
    if model.output is not None:
        sharding["output"] = ColwiseParallel(
            input_layouts=Shard(1),
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        )
    return sharding


def feed_forward_sharding(block: nn.Module, name: str) -> dict:
    """A SwiGLU feed-forward at `name` of `block`: the sequence gathered in, hidden units split,
    the output reduce-scattered back over the sequence. Float8 linears (tensorwise): the input
    is cast to float8 before its gather (models/common/float8.py)."""
    ffn = block.get_submodule(name)
    s = float8_tp_styles([ffn.w1, ffn.w2, ffn.w3])
    return {
        name: s.prepare_input(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        f"{name}.w1": s.colwise(),
        f"{name}.w2": s.rowwise(output_layouts=Shard(1)),
        f"{name}.w3": s.colwise(),
    }


def gqa_sharding(block: nn.Module, name: str, qk_norm: bool = False) -> dict:
    """common.gqa.GroupedQueryAttention at `name`: the sequence gathered in, heads split
    (q, k, v column-wise), the output reduce-scattered back over the sequence. QK-norm
    weights are replicated: each rank normalises its own heads (input sharded on the heads
    dim), so their gradient is a partial sum that DTensor adds up over TP."""
    attn = block.get_submodule(name)
    s = float8_tp_styles([attn.wq, attn.wk, attn.wv, attn.wo])
    sharding = {
        name: s.prepare_input(
            input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)
        ),
        f"{name}.wq": s.colwise(),
        f"{name}.wk": s.colwise(),
        f"{name}.wv": s.colwise(),
        f"{name}.wo": s.rowwise(output_layouts=Shard(1)),
    }
    if qk_norm:
        sharding[f"{name}.q_norm"] = ReplicateParallel(input_layout=Shard(2))
        sharding[f"{name}.k_norm"] = ReplicateParallel(input_layout=Shard(2))
    return sharding


def moe_sharding(block: nn.Module, name: str, shared_experts: bool = False) -> dict:
    """A common.moe.MoE at `name`. Under sequence parallel each TP rank routes its own tokens
    (the router's gradient is summed over TP); expert parallel moves them to their experts:
    with etp 1 EP includes the TP ranks and routed experts are not TP-split; with etp = tp
    each expert is split over TP and every token copy visits each TP rank of its expert's
    EP rank (distributed/expert_parallel.py). Either way this plan is the same. Shared
    experts, if any, are a SwiGLU feed-forward split as `feed_forward_sharding`."""
    sharding = {
        name: PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Shard(1),), use_local_output=True
        ),
        f"{name}.router.gate": ReplicateParallel(input_layout=Shard(0)),
    }
    if shared_experts:
        sharding.update(feed_forward_sharding(block, f"{name}.shared_experts"))
    return sharding


def split_moe_tokens(model, tp_mesh) -> None:
    """Every MoE layer of `model` routes 1/tp of each sequence (sequence parallel): its
    balance-loss statistics are summed over the TP group (common.moe.MoE.token_group)."""
    for layer in moe_modules(model):
        layer.token_group = (tp_mesh.get_group().group_name, tp_mesh.size())
