"""Layout-independent weight init.

Each parameter is drawn from its own generator (seed + a hash of its name). A tensor larger
than CHUNK_ELEMENTS is drawn in row blocks of at most that size, block b from the generator
of f"{name}#block{b}", and a rank draws only the blocks that hold rows of its shard, keeping
those rows (and its columns). Every layout (1 rank, FSDP, HSDP, TP, PP) therefore starts from
bitwise the same weights, which is what makes loss-parity checks meaningful, and no rank ever
holds more than one block beside its shards (a whole 128K x 16K output layer would be 8.4 GB
on every rank). CUDA's generator draws other numbers than CPU's, so the weights are the same
in every layout of one device type, not across device types: start from a seed checkpoint
(--checkpoint.create_seed_checkpoint) for the same weights anywhere.
"""

import math
import zlib
from collections.abc import Callable, Sequence

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


# Output projections of attention and FFN (and the experts' stacks of them): their init
# shrinks with depth, which keeps the residual stream's variance flat with depth.
_DEPTH_SCALED = ("wo.weight", "w2.weight", "w3.weight", "experts.w2", "experts.w3")


def transformer_init_fn(fqn: str, dim: int) -> InitFn:
    """The initial distribution of parameter `fqn` (original, unwrapped name) of a decoder
    whose blocks are `layers.<i>` with embeddings `tok_embeddings`, head `output`, norms `*norm`."""
    if fqn.endswith("norm.weight"):
        return ones()
    if fqn.startswith("tok_embeddings"):
        return normal(1.0)
    if fqn.startswith("output"):
        return trunc_normal(dim**-0.5)
    layer_id = int(fqn.split(".")[1])
    if fqn.endswith(_DEPTH_SCALED):
        return trunc_normal(0.02 / math.sqrt(2 * (layer_id + 1)))
    return trunc_normal(0.02)


@torch.no_grad()
def init_parameters(
    model: nn.Module,
    init_fn_for: Callable[[str], InitFn],
    seed: int,
    device,
    per_expert: Callable[[str], bool] | None = None,
    *,
    aliases: dict[str, str] | None = None,
) -> None:
    """Fill every (possibly sharded) parameter of `model` in place; parameters whose clean
    name `per_expert` accepts are [E, ...] expert stacks, drawn per expert (`init_expert_stack`).
    `aliases`: a parameter drawn as another one (a pipeline stage's copy of a tied weight)."""
    for name, param in model.named_parameters():
        fqn = clean_fqn(name)
        fqn = (aliases or {}).get(fqn, fqn)
        if per_expert is not None and per_expert(fqn):
            init_expert_stack(param, fqn, init_fn_for(fqn), seed, device)
            continue
        init_in_blocks(param, init_fn_for(fqn), fqn, seed, device)


CHUNK_ELEMENTS = 1 << 22  # 16 MiB of fp32 per block


@torch.no_grad()
def init_in_blocks(
    param: torch.Tensor,
    init_fn: InitFn,
    fqn: str,
    seed: int,
    device,
    *,
    chunk_elements: int | None = None,
) -> None:
    """Fill `param` (its local shard if a DTensor): one draw of the whole tensor if it fits
    in `chunk_elements`, else row blocks, each from its own generator; only the blocks
    holding this rank's rows are drawn."""
    shape = tuple(param.shape)
    row = math.prod(shape[1:]) if len(shape) > 1 else 1
    rows_per_block = max(1, (chunk_elements or CHUNK_ELEMENTS) // row)
    if not shape or rows_per_block >= shape[0]:  # one block: the whole tensor
        full = torch.empty(shape, dtype=torch.float32, device=device)
        init_fn(full, _generator(fqn, seed, device))
        copy_full_into(param, full)
        return

    def draw(block: int, start: int, stop: int) -> torch.Tensor:
        drawn = torch.empty((stop - start, *shape[1:]), dtype=torch.float32, device=device)
        init_fn(drawn, _generator(f"{fqn}#block{block}", seed, device))
        return drawn

    blocks = [
        (b, start, min(start + rows_per_block, shape[0]))
        for b, start in enumerate(range(0, shape[0], rows_per_block))
    ]
    if not isinstance(param, DTensor):
        for b, start, stop in blocks:
            param[start:stop].copy_(draw(b, start, stop))
        return
    rows = local_indices(param, 0).to(device)
    cols = [
        local_indices(param, d).to(device)
        if any(getattr(p, "dim", None) == d for p in param.placements)
        else None
        for d in range(1, len(shape))
    ]
    local = param.to_local()
    filled = 0
    for b, start, stop in blocks:
        mine = ((rows >= start) & (rows < stop)).nonzero().flatten()  # local rows in this block
        if mine.numel() == 0:
            continue  # another rank's rows: not drawn here
        picked = draw(b, start, stop).index_select(0, rows[mine] - start)
        for d, idx in enumerate(cols, start=1):
            if idx is not None:
                picked = picked.index_select(d, idx)
        # (CPU offload: `local` on the host, the draw on the accelerator)
        local.index_copy_(0, mine.to(local.device), picked.to(local.device, local.dtype))
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


def expert_slices(
    fqn: str, init_fn: InitFn, seed: int, device, shape, *, experts: Sequence[int]
) -> torch.Tensor:
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
            placements.append(
                _StridedShard(0, split_factor=p.split_factor) if p.dim == dim else Replicate()
            )
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
        param.copy_(expert_slices(fqn, init_fn, seed, device, shape, experts=range(shape[0])))
        return
    block = expert_slices(
        fqn, init_fn, seed, device, shape, experts=local_indices(param, 0).tolist()
    )
    for d in range(1, len(shape)):
        if any(getattr(p, "dim", None) == d for p in param.placements):  # TP / FSDP on dim d
            block = block.index_select(d, local_indices(param, d).to(block.device))
    param.to_local().copy_(block)
