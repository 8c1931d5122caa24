"""Tensor-parallel helpers shared by the models' TP plans."""

import contextlib

from torch.distributed.tensor.parallel import loss_parallel


def loss_parallel_context(enabled: bool):
    """Cross-entropy on vocabulary-sharded logits (forward and backward must both run in it)."""
    return loss_parallel() if enabled else contextlib.nullcontext()
