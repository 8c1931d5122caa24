"""Layout-independent weight init.

Each parameter is drawn in full from its own generator (seed + a hash of its name), then
this rank keeps only its shard. Every layout (1 rank, FSDP, HSDP, TP, PP) therefore starts
from bitwise the same weights, which is what makes loss-parity checks meaningful.
"""

import zlib
from typing import Callable

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

InitFn = Callable[[torch.Tensor, torch.Generator], None]

_WRAPPER_PARTS = ("_orig_mod.", "_checkpoint_wrapped_module.", "_fsdp_wrapped_module.")


def clean_fqn(name: str) -> str:
    """A parameter name without the segments compile / AC / wrappers insert."""
    for part in _WRAPPER_PARTS:
        name = name.replace(part, "")
    return name


def normal(std: float) -> InitFn:
    return lambda t, g: t.normal_(0.0, std, generator=g)


def trunc_normal(std: float, cutoff: float = 3.0) -> InitFn:
    return lambda t, g: nn.init.trunc_normal_(t, 0.0, std, -cutoff * std, cutoff * std, generator=g)


def ones() -> InitFn:
    return lambda t, g: t.fill_(1.0)


@torch.no_grad()
def init_parameters(model: nn.Module, init_fn_for: Callable[[str], InitFn], seed: int, device) -> None:
    """Fill every (possibly sharded) parameter of `model` in place."""
    for name, param in model.named_parameters():
        fqn = clean_fqn(name)
        gen = torch.Generator(device=device)
        gen.manual_seed((seed * 1_000_003 + zlib.crc32(fqn.encode())) % (2**63))
        full = torch.empty(param.shape, dtype=torch.float32, device=device)
        init_fn_for(fqn)(full, gen)
        if isinstance(param, DTensor):
            local = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
            param.to_local().copy_(local.to_local())
        else:
            param.copy_(full)
