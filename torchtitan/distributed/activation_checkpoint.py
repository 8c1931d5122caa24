"""Activation checkpointing: none, full, selective per op, selective every n-th block.

The per-block SAC policy is built here and only here (`sac_policy`), so that a
communication policy can later be combined with the compute-op policy in one place.
"""

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

aten = torch.ops.aten

# Compute-heavy ops whose outputs op-level SAC keeps: recomputing them costs the most FLOPs
# per byte saved. Everything else (norms, activations, casts, views) is recomputed.
_ATTENTION_OPS = [
    name
    for name in (
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
    )
    if hasattr(aten, name)
]
SAVE_OPS = {aten.mm.default, aten.addmm.default, aten.bmm.default, *(getattr(aten, n).default for n in _ATTENTION_OPS)}


def compute_policy(ctx, func, *args, **kwargs) -> CheckpointPolicy:
    """Op policy: keep the outputs of matmuls and attention, recompute everything else."""
    return CheckpointPolicy.MUST_SAVE if func in SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def block_policy():
    """The SAC policy of one block. The single place where policies are combined."""
    return compute_policy


def _op_sac_context():
    return create_selective_checkpoint_contexts(block_policy())


def wrap_block(block: nn.Module, mode: str, option: str, index: int) -> nn.Module:
    """Return `block`, checkpointed as the config says (or unchanged)."""
    if mode == "none":
        return block
    if mode == "full":
        return checkpoint_wrapper(block, preserve_rng_state=False)
    if option == "op":
        return checkpoint_wrapper(block, context_fn=_op_sac_context, preserve_rng_state=False)
    every = int(option)
    if index % every == 0:
        return checkpoint_wrapper(block, preserve_rng_state=False)
    return block


def apply_ac(layers: nn.ModuleDict, ac_cfg) -> None:
    """Checkpoint the blocks of `layers` in place (names gain _checkpoint_wrapped_module)."""
    for position, (name, block) in enumerate(list(layers.items())):
        layers[name] = wrap_block(block, ac_cfg.mode, ac_cfg.selective_ac_option, position)
