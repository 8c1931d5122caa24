"""torch.compile per transformer block (one graph per block, reused across blocks)."""

import torch
from torch import nn


def apply_compile(layers: nn.ModuleDict, compile_cfg) -> None:
    for name, block in list(layers.items()):
        layers[name] = torch.compile(block, backend=compile_cfg.backend, fullgraph=True)
