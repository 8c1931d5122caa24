"""An MLP-only language model that keeps the model contract (torchtitan/models/protocol.py)."""

from functools import partial

import torch
from torch import nn

from torchtitan.distributed.plan import FsdpUnit
from torchtitan.models.common.feed_forward import FeedForward
from torchtitan.models.common.init import init_parameters, normal, ones
from torchtitan.models.common.rmsnorm import RMSNorm


class Block(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.mlp = FeedForward(args.dim, args.hidden)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.mlp(self.norm(h))


def _init_fn(fqn: str, dim: int):
    return ones() if fqn.endswith("norm.weight") else normal(dim**-0.5)


class TinyLM(nn.Module):
    first_stage_modules = ("tok_embeddings",)
    last_stage_modules = ("norm", "output")

    def __init__(self, args):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleDict({str(i): Block(args) for i in range(args.n_layers)})
        self.norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        self.context_parallel = None  # this model does not support context parallel

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = layer(h)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h

    def fsdp_units(self) -> list[FsdpUnit]:
        units = [FsdpUnit("tok_embeddings")] if self.tok_embeddings is not None else []
        return units + [FsdpUnit(f"layers.{k}", block=f"layers.{k}") for k in self.layers.keys()]

    def init_weights(self, seed: int, device) -> None:
        init_parameters(self, partial(_init_fn, dim=self.args.dim), seed, device)

    def flops_per_token(self, seq_len: int) -> float:
        return 6.0 * sum(
            p.numel() for n, p in self.named_parameters() if not n.startswith("tok_embeddings")
        )
