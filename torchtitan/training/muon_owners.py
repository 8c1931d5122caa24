"""Where Muon's Newton-Schulz runs when FSDP, TP or EP hold a matrix in shards
(optimizer.muon_orthogonalize).

"owner" (the default): every matrix gets one owner among the ranks that hold its shards, and
only the owner iterates on it. The matrices are dealt out by their iteration cost (largest
first, each to the owner with the least so far: an even share; with equal matrices this is
round-robin). One all_to_all per mesh dimension that splits them brings each owner the
shards of its matrices, a second returns each rank its shards of the results. A matrix
sharded over two mesh dimensions (FSDP over TP) is assembled in two hops: over the inner
dimension into the outer dimension's pieces, then over the outer one into the whole; its
owners are spread over both (every rank of an 8 x 8 FSDP x TP mesh iterates on 1/64 of the
matrices, not 1/8). The shards travel in ns_dtype: Newton-Schulz's first step is that cast,
so this is the same arithmetic as casting the whole matrix, in half the bytes under bfloat16.

Per step and hop: 2 all_to_all (one there, one back), for all the matrices at once (the
fewest calls; nothing is left to overlap them with once the gradients are reduced). Over one
hop each rank sends its shards once there and receives them once back, and its buffers hold
its own matrices whole: about its shards' size again, in ns_dtype.

Stacks of matrices (routed experts) split only along the stack (EP's experts, FSDP's shards of
whole experts) hold whole matrices: they iterate where they are, with no communication, as do
replicated ones (DDP, HSDP's replicas, which each run the same exchange over their shards).

"every_rank": each matrix is gathered whole on every rank of its mesh (DTensor's full_tensor,
in the update's float32), which iterates on all of them and keeps its shard: the simplest
exact form, for comparison; every rank iterates on every matrix.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from torch.distributed.tensor.placement_types import _StridedShard

MODES = ("owner", "every_rank")


def _shard_dims(t: DTensor) -> list[int]:
    """The mesh dimensions that split t's matrices (its last two tensor dimensions). FSDP's
    _StridedShard (its shards of a TP shard) is no Shard subclass: named apart."""
    return [
        i
        for i, pl in enumerate(t.placements)
        if isinstance(pl, (Shard, _StridedShard))
        and pl.dim % t.ndim >= t.ndim - 2
        and t.device_mesh.size(i) > 1  # FSDP's mesh of one rank (TP alone) splits nothing
    ]


def _hops(t: DTensor) -> list[int]:
    """t's splitting mesh dimensions from the innermost to the outermost. DTensor splits in
    mesh order (the first dimension outermost), but a _StridedShard splits within the later
    dimensions' pieces (innermost); splits of different tensor dimensions commute, and are
    taken with the lower mesh dimension inner (FSDP's, so TP's row- and column-wise matrices
    share one order)."""
    pl = t.placements

    def outer_first(a: int, b: int) -> int:  # a < b in mesh order
        same = pl[a].dim % t.ndim == pl[b].dim % t.ndim
        if same and not isinstance(pl[a], _StridedShard):
            return -1  # a outer
        return 1

    def cmp(a: int, b: int) -> int:
        return outer_first(a, b) if a < b else -outer_first(b, a)

    outer_to_inner = sorted(_shard_dims(t), key=functools.cmp_to_key(cmp))
    return outer_to_inner[::-1]


def cost(shape) -> int:
    """Newton-Schulz work of a matrix (or stack): its elements x its shorter side."""
    return math.prod(shape) * min(shape[-2], shape[-1])


@dataclass
class _Entry:
    """One matrix (or stack) to iterate: what this rank holds of it at each hop."""

    index: int  # position in the caller's list
    update: DTensor
    owner: tuple  # its owner's coordinate on each hop's mesh dimension (innermost first)
    dims: list[int]  # the tensor dimension each hop assembles
    sizes: list[list[int]]  # each hop: every rank's length along its dimension
    pieces: list[torch.Tensor] = field(default_factory=list)  # held before each hop


class Orthogonalizer:
    """Runs `ns` (a function of a whole matrix or stack) once per matrix of a list of Muon
    updates, in `mode` (module docstring)."""

    def __init__(self, mode: str, exchange_dtype: torch.dtype):
        if mode not in MODES:
            raise ValueError(f"muon_orthogonalize={mode!r}: one of {MODES}")
        self.mode = mode
        self.dtype = exchange_dtype

    def __call__(self, updates: list[torch.Tensor], ns) -> list[torch.Tensor]:
        """The orthogonalized updates, each laid out as its update (a DTensor of the same
        placements, or a plain tensor), in ns's dtype."""
        out: list[torch.Tensor | None] = [None] * len(updates)
        groups: dict[tuple, list[int]] = {}
        for i, u in enumerate(updates):
            if not isinstance(u, DTensor) or not _shard_dims(u):
                local = u.to_local() if isinstance(u, DTensor) else u
                # whole matrices already (or none: more ranks than experts): no communication
                out[i] = self._as(u, ns(local) if local.numel() else local.to(self.dtype))
            elif self.mode == "every_rank":
                whole = ns(u.full_tensor())
                out[i] = distribute_tensor(whole, u.device_mesh, u.placements, src_data_rank=None)
            else:
                groups.setdefault((u.device_mesh, tuple(_hops(u))), []).append(i)
        for (mesh, hops), indices in groups.items():
            entries = self._plan(mesh, hops, [(i, updates[i]) for i in indices])
            for e, local in self._exchange(mesh, hops, entries, ns):
                out[e.index] = self._as(e.update, local)
        return out

    def describe(self, params: list[torch.Tensor]) -> str:
        """Where these parameters' matrices are iterated, and what that exchanges per step
        (for the start-up line)."""
        here, gathered, groups = 0, 0, {}
        for i, p in enumerate(params):
            if not isinstance(p, DTensor) or not _shard_dims(p):
                here += 1
            elif self.mode == "every_rank":
                gathered += 1
            else:
                groups.setdefault((p.device_mesh, tuple(_hops(p))), []).append(i)
        parts = []
        for (mesh, hops), indices in groups.items():
            names = mesh.mesh_dim_names or tuple(str(i) for i in range(mesh.ndim))
            owners = self.owners(mesh, hops, [tuple(params[i].shape) for i in indices])
            me = tuple(mesh.get_local_rank(h) for h in hops)
            over = " x ".join(f"{names[h]} ({mesh.size(h)})" for h in reversed(hops))
            parts.append(
                f"{len(indices)} over {over}: this rank owns {owners.count(me)}, by"
                f" {2 * len(hops)} all_to_all per step"
            )
        if gathered:
            parts.append(f"{gathered} gathered whole on every rank (an all-gather per mesh dim)")
        if here:
            parts.append(f"{here} whole where they are (no exchange)")
        return f"Muon orthogonalizes ({self.mode}): " + "; ".join(parts)

    @staticmethod
    def _as(u: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
        if isinstance(u, DTensor):
            return DTensor.from_local(
                local,
                u.device_mesh,
                u.placements,
                run_check=False,
                shape=u.shape,
                stride=u.stride(),
            )
        return local

    @staticmethod
    def owners(mesh, hops, shapes: list) -> list[tuple]:
        """Each matrix's owner (a coordinate per hop): by cost, largest first, each to the
        owner with the least so far (ties: the lower index), alike on every rank."""
        counts = [mesh.size(h) for h in hops]
        load = [0] * math.prod(counts)
        flat = [0] * len(shapes)
        for k in sorted(range(len(shapes)), key=lambda k: (-cost(shapes[k]), k)):
            flat[k] = min(range(len(load)), key=lambda o: (load[o], o))
            load[flat[k]] += cost(shapes[k])
        coords = []
        for f in flat:
            c = []
            for n in counts:
                c.append(f % n)
                f //= n
            coords.append(tuple(c))
        return coords

    def _plan(self, mesh, hops, items) -> list[_Entry]:
        owners = self.owners(mesh, hops, [tuple(u.shape) for _, u in items])
        entries = []
        for (i, u), owner in zip(items, owners):
            length = list(u.shape)
            dims, sizes = [], []
            for h in reversed(hops):  # outermost first: each splits what the outer ones left
                d = u.placements[h].dim % u.ndim
                n, me = mesh.size(h), mesh.get_local_rank(h)
                split = [Shard.local_shard_size_and_offset(length[d], n, r)[0] for r in range(n)]
                dims.insert(0, d)
                sizes.insert(0, split)
                length[d] = split[me]
            entries.append(_Entry(i, u, owner, dims, sizes, [u.to_local().to(self.dtype)]))
        return entries

    def _exchange(self, mesh, hops, entries: list[_Entry], ns):
        """Gather each matrix to its owner hop by hop (innermost first), iterate, and return
        the shards the way they came; yields (entry, this rank's shard of the result)."""
        held = entries  # the entries whose piece this rank holds at the current hop
        like = entries[0].pieces[0]
        trail = []
        for k, h in enumerate(hops):
            me = mesh.get_local_rank(h)
            owned = [e for e in held if e.owner[k] == me]
            got = _all_to_all(
                mesh.get_group(h),
                [[e.pieces[k] for e in held if e.owner[k] == r] for r in range(mesh.size(h))],
                [[_shape(e.pieces[k], e.dims[k], e.sizes[k][r]) for e in owned] for r in
                 range(mesh.size(h))],
                like,
            )  # fmt: skip
            for j, e in enumerate(owned):
                e.pieces.append(torch.cat([got[r][j] for r in range(len(got))], dim=e.dims[k]))
            trail.append((h, held, owned))
            held = owned
        results = {id(e): ns(e.pieces[-1]).to(self.dtype) for e in held}
        for k in reversed(range(len(hops))):
            h, held, owned = trail[k]
            splits = [results[id(e)].split(e.sizes[k], dim=e.dims[k]) for e in owned]
            got = _all_to_all(
                mesh.get_group(h),
                [[s[r] for s in splits] for r in range(mesh.size(h))],
                [[e.pieces[k].shape for e in held if e.owner[k] == r] for r in
                 range(mesh.size(h))],
                like,
            )  # fmt: skip
            results = {}
            for r, pieces in enumerate(got):
                for e, piece in zip([e for e in held if e.owner[k] == r], pieces):
                    results[id(e)] = piece
        for e in entries:
            e.pieces = []
            yield e, results[id(e)]


def _shape(t: torch.Tensor, dim: int, size: int) -> list[int]:
    shape = list(t.shape)
    shape[dim] = size
    return shape


def _all_to_all(group, sends: list[list[torch.Tensor]], recv_shapes: list[list], like) -> list:
    """One all_to_all_single: sends[r] to rank r of `group`, received as recv_shapes[r] (in
    `like`'s dtype and device)."""
    flat = [t.reshape(-1) for ts in sends for t in ts]
    send = torch.cat(flat) if flat else like.new_empty(0)
    send_splits = [sum(t.numel() for t in ts) for ts in sends]
    recv_splits = [sum(math.prod(s) for s in shapes) for shapes in recv_shapes]
    recv = like.new_empty(sum(recv_splits))
    dist.all_to_all_single(recv, send, recv_splits, send_splits, group=group)
    out = []
    for flat, shapes in zip(recv.split(recv_splits), recv_shapes):
        sizes = [math.prod(s) for s in shapes]
        out.append([p.view(s) for p, s in zip(flat.split(sizes), shapes)])
    return out
