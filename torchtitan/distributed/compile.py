"""torch.compile per transformer block (one graph per block, reused across blocks)."""

import torch
from torch import nn

from torchtitan.config.job_config import Compile


def apply_compile(layers: nn.ModuleDict, compile_cfg: Compile, fullgraph: bool = True) -> None:
    """fullgraph=False for blocks that break the graph on purpose (MoE dispatch runs eager)."""
    for name, block in list(layers.items()):
        layers[name] = torch.compile(block, backend=compile_cfg.backend, fullgraph=fullgraph)
