"""Layout-independent weight init.

Each parameter is drawn from its own generator (seed + a hash of its name), in row blocks of
at most CHUNK_ELEMENTS in order, and this rank keeps only the rows (and columns) of each
block that its shard holds. Every layout (1 rank, FSDP, HSDP, TP, PP) therefore starts from
bitwise the same weights, which is what makes loss-parity checks meaningful, and no rank
ever holds more than one block beside its shards (a full 128K x 16K output layer would be
8.4 GB per rank). On CPU the blocks draw exactly what one draw of the whole tensor would
(CPU generators are sequential; blocks are multiples of 16 elements, the unit of torch's
normal_). CUDA's generator differs from CPU's, so the weights are the same in every layout
of one device type, not across device types: start from a seed checkpoint
(--checkpoint.create_seed_checkpoint) for the same weights anywhere.

Stacks of routed experts ([E, ...], named by `init_parameters(..., per_expert=...)`) are
drawn one expert at a time from generators named `f"{fqn}[{e}]"`, so a rank holding some
experts (expert parallelism: a DTensor sharded on dim 0) draws only those, never all E.
"""

import math
import zlib
from typing import Callable, Sequence

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
def init_parameters(
    model: nn.Module, init_fn_for: Callable[[str], InitFn], seed: int, device,
    per_expert: Callable[[str], bool] | None = None,
) -> None:
    """Fill every (possibly sharded) parameter of `model` in place; parameters whose clean
    name `per_expert` accepts are [E, ...] expert stacks, drawn per expert (`init_expert_stack`)."""
    for name, param in model.named_parameters():
        fqn = clean_fqn(name)
        if per_expert is not None and per_expert(fqn):
            init_expert_stack(param, fqn, init_fn_for(fqn), seed, device)
            continue
        init_in_blocks(param, init_fn_for(fqn), _generator(fqn, seed, device), device)


CHUNK_ELEMENTS = 1 << 22  # 16 MiB of fp32 per block


@torch.no_grad()
def init_in_blocks(param: torch.Tensor, init_fn: InitFn, gen: torch.Generator, device,
                   chunk_elements: int = CHUNK_ELEMENTS) -> None:
    """Fill `param` (its local shard if a DTensor) with what init_fn would draw for the whole
    tensor, drawing row blocks of the whole tensor in order and keeping this rank's part."""
    shape = tuple(param.shape)
    row = math.prod(shape[1:]) if len(shape) > 1 else 1
    rows_per_block = max(1, chunk_elements // row) if shape else 1
    if row * rows_per_block % 16 and rows_per_block < (shape[0] if shape else 1):
        rows_per_block = max(16, rows_per_block - rows_per_block % 16)  # 16 rows: a multiple of 16 elements
    if not shape or rows_per_block >= shape[0]:  # one block: the whole tensor
        full = torch.empty(shape, dtype=torch.float32, device=device)
        init_fn(full, gen)
        copy_full_into(param, full)
        return
    if not isinstance(param, DTensor):
        for start in range(0, shape[0], rows_per_block):
            block = param[start:start + rows_per_block]
            drawn = torch.empty(block.shape, dtype=torch.float32, device=device)
            init_fn(drawn, gen)
            block.copy_(drawn)
        return
    rows = local_indices(param, 0).to(device)
    cols = [local_indices(param, d).to(device) if any(getattr(p, "dim", None) == d for p in param.placements)
            else None for d in range(1, len(shape))]
    local = param.to_local()
    filled = 0
    for start in range(0, shape[0], rows_per_block):
        stop = min(start + rows_per_block, shape[0])
        drawn = torch.empty((stop - start, *shape[1:]), dtype=torch.float32, device=device)
        init_fn(drawn, gen)  # every rank draws every block: the generator advances identically
        mine = ((rows >= start) & (rows < stop)).nonzero().flatten()  # local rows in this block
        if mine.numel() == 0:
            continue
        picked = drawn.index_select(0, rows[mine] - start)
        for d, idx in enumerate(cols, start=1):
            if idx is not None:
                picked = picked.index_select(d, idx)
        local.index_copy_(0, mine, picked.to(local.dtype))
        filled += mine.numel()
    assert filled == local.shape[0], (filled, local.shape)


@torch.no_grad()
def copy_full_into(param: torch.Tensor, full: torch.Tensor) -> None:
    """Copy this rank's part of the full tensor `full` into `param` (a DTensor of any
    placements, or a plain tensor); no communication."""
    if isinstance(param, DTensor):
        local = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
        param.to_local().copy_(local.to_local())
    else:
        param.copy_(full)


def _generator(name: str, seed: int, device) -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
    return gen


def expert_slices(fqn: str, init_fn: InitFn, seed: int, device, shape, experts: Sequence[int]) -> torch.Tensor:
    """Experts `experts` (global indices) of the [E, *shape[1:]] stack `fqn`, expert e drawn
    whole from the generator of the name f"{fqn}[{e}]": the same values whichever experts a
    rank draws."""
    out = torch.empty((len(experts), *shape[1:]), dtype=torch.float32, device=device)
    for i, e in enumerate(experts):
        init_fn(out[i], _generator(f"{fqn}[{e}]", seed, device))
    return out


def local_indices(param: DTensor, dim: int) -> torch.Tensor:
    """Global indices along `dim` that this rank's shard of `param` holds, in local order.

    Sharding each tensor dim is independent, so the local shard is the product of these
    per-dim index sets. Sharding an arange with the placements that act on `dim` gives them
    exactly, _StridedShard (FSDP on top of EP / TP) and uneven splits included; no
    communication (src_data_rank=None)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    placements = []
    for p in param.placements:
        if isinstance(p, _StridedShard):  # not a Shard subclass, and is_shard() is False
            placements.append(_StridedShard(0, split_factor=p.split_factor) if p.dim == dim else Replicate())
        elif p.is_shard():
            placements.append(Shard(0) if p.dim == dim else Replicate())
        else:
            placements.append(Replicate())  # parameters are never Partial
    idx = torch.arange(param.shape[dim], device=param.device_mesh.device_type)
    return distribute_tensor(idx, param.device_mesh, placements, src_data_rank=None).to_local()


@torch.no_grad()
def init_expert_stack(param: torch.Tensor, fqn: str, init_fn: InitFn, seed: int, device) -> None:
    """Fill an [E, ...] expert stack in place, drawing only the experts this rank holds."""
    shape = tuple(param.shape)
    if not isinstance(param, DTensor):
        param.copy_(expert_slices(fqn, init_fn, seed, device, shape, range(shape[0])))
        return
    block = expert_slices(fqn, init_fn, seed, device, shape, local_indices(param, 0).tolist())
    for d in range(1, len(shape)):
        if any(getattr(p, "dim", None) == d for p in param.placements):  # TP / FSDP on dim d
            block = block.index_select(d, local_indices(param, d).to(block.device))
    param.to_local().copy_(block)
