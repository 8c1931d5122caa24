"""Tied weights under pipeline parallel: the first stage holds the parameter (an embedding),
the last stage a copy of it (the output head that is the same matrix). Both start equal
(drawn or read as one tensor); `TiedCopies` keeps them equal, as one parameter would be:

- after backward, each copy's gradient becomes the sum of both (the one parameter's gradient),
  by an all-reduce between the first and last pipeline rank (or a local add when one rank
  holds both stages, as V schedules do);
- the gradient norm counts the copy once (`counted`), so clipping equals one rank's;
- both optimizers then take the same step from the same state.

Knows no model: the parts say which of their parameters is whose copy (`tied_weights`,
{copy name: parameter name}, models/common/tied.py).
"""

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def _named(part) -> dict:
    # tied weights sit outside the blocks, which are the only modules AC and compile wrap:
    # their names are the model's own
    return dict(part.named_parameters())


class TiedCopies:
    def __init__(self, model_parts, ends_group: dist.ProcessGroup | None):
        self.pairs = []  # (parameter or None, copy or None) on this rank
        for copy, source in getattr(model_parts[0], "tied_weights", {}).items():
            src = next((ps[source] for ps in map(_named, model_parts) if source in ps), None)
            dst = next(
                (ps[copy] for ps in map(_named, model_parts) if copy in ps and source not in ps),
                None,
            )
            if src is not None or dst is not None:
                self.pairs.append((src, dst))
        self.group = ends_group

    def copies(self) -> set[int]:
        """ids of the copies (left out of the gradient norm: their parameter counts them)."""
        return {id(dst) for src, dst in self.pairs if dst is not None}

    @torch.no_grad()
    def sum_gradients(self) -> None:
        for src, dst in self.pairs:
            if src is not None and dst is not None:  # both stages here
                total = src.grad + dst.grad
                src.grad.copy_(total)
                dst.grad.copy_(total)
                continue
            param = src if src is not None else dst
            grad = param.grad
            local = grad.to_local() if isinstance(grad, DTensor) else grad
            dist.all_reduce(local, group=self.group)
