"""RMSNorm written with out-of-place ops only.

torch's RMSNorm on CPU adds eps in place to an intermediate; a checkpoint region that saves
that intermediate (SimpleFSDP's "save everything but the gathers" region) then refuses to
run backward because a cached tensor was mutated. Out-of-place arithmetic avoids it.
"""

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight
