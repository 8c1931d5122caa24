"""Gradient clipping by the global norm, aware of sharding (DTensor gradients on several
meshes) and of pipeline stages."""

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


@torch.no_grad()
def clip_grad_norm_(
    parameters: Iterable[torch.Tensor],
    max_norm: float,
    pp_group: dist.ProcessGroup | None = None,
    also_clip: Iterable[torch.Tensor] = (),
) -> torch.Tensor:
    """Global L2 norm of all gradients (over shards, and over stages when pp_group is given);
    clips in place when max_norm > 0. Returns the norm before clipping as a plain tensor.
    `also_clip`: clipped by that norm but not counted in it (a tied weight's second copy).

    Gradients may live on different meshes (dense parameters on the data-parallel x TP mesh,
    experts on their own): each mesh's squared norm is reduced over that mesh, then summed."""
    grads = [p.grad for p in parameters if p.grad is not None]
    by_mesh: dict = {}
    for g in grads:
        by_mesh.setdefault(g.device_mesh if isinstance(g, DTensor) else None, []).append(g)
    norms = []
    for group in by_mesh.values() or [[]]:
        norm = torch.nn.utils.get_total_norm(group, norm_type=2.0, foreach=True)
        norms.append(
            norm.full_tensor() if isinstance(norm, DTensor) else norm
        )  # full_tensor sums over shards
    norm = norms[0] if len(norms) == 1 else torch.stack([n**2 for n in norms]).sum().sqrt()
    if pp_group is not None:
        sq = norm**2
        dist.all_reduce(sq, group=pp_group)
        norm = sq.sqrt()
    if max_norm > 0:
        for p in also_clip:
            if p.grad is not None:
                by_mesh.setdefault(
                    p.grad.device_mesh if isinstance(p.grad, DTensor) else None, []
                ).append(p.grad)
        for group in by_mesh.values():  # foreach ops cannot mix DTensors of different meshes
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, norm, foreach=True)
    return norm
