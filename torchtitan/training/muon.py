"""Muon for the hidden matrices, AdamW for the rest ([optimizer] name = "Muon").

Muon (torch 2.13's torch.optim.Muon semantics, written here for sharded parameters): per
matrix, an EMA momentum buffer (buf <- buf + (1 - momentum) (grad - buf)), the Nesterov
update grad + momentum (buf - grad), orthogonalized by `ns_steps` Newton-Schulz iterations
of the quintic (a, b, c), decoupled weight decay with the unadjusted lr, and the update
scaled by the lr adjusted from the matrix's global shape ("original": sqrt(max(1, rows /
cols)); "match_rms_adamw": 0.2 sqrt(max(rows, cols))).

Newton-Schulz needs the whole matrix, and FSDP, TP and EP hold shards: muon_owners.py
decides where each matrix is iterated (by default on one owner per matrix, round-robin over
the ranks that shard it) and moves the shards there and back. Every matrix is orthogonalized
whole, exactly once per mesh replica, as on one rank.

Which parameters: 2-D ones and 3-D stacks of matrices (MoE routed experts, one matrix per
expert: the iterations run batched, the lr adjusted from one expert's shape), except the
embeddings, the output layer and MoE routers (AdamW, as the Muon authors advise), and those
optimizer.adamw_params names; optimizer.muon_params names are Muon's whatever the rule says
(they must be matrices). Norms and biases are AdamW's.
"""

from __future__ import annotations

import fnmatch
import functools
import math

import torch

from torchtitan.config.manager import ConfigError
from torchtitan.training.muon_owners import Orthogonalizer
from torchtitan.training.optimizer_list import OptimizerList

OPT = "--optimizer"
# parameters the rule leaves to AdamW though 2-D (the token embedding, the output layer, the
# MoE router; tied embeddings are both)
ADAMW_BY_DEFAULT = ("tok_embeddings.*", "output.*", "*.router.*", "*.gate.weight")
NS_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
ADJUST_LR = ("original", "match_rms_adamw")


def split(named: list[tuple[str, torch.nn.Parameter]], opt_cfg) -> tuple[list, list]:
    """(Muon's, AdamW's) (name, parameter) pairs of one model part (module docstring)."""
    muon, adamw = [], []
    for name, p in named:
        if not p.requires_grad:
            continue
        if any(fnmatch.fnmatchcase(name, pat) for pat in opt_cfg.muon_params):
            if p.ndim not in (2, 3):
                raise ConfigError(
                    f"{OPT}.muon_params: {name} is {p.ndim}-D {tuple(p.shape)}; Muon takes"
                    " matrices only (2-D, or 3-D stacks of them): drop it from the patterns"
                )
            muon.append((name, p))
        elif (
            p.ndim in (2, 3)
            and not any(fnmatch.fnmatchcase(name, pat) for pat in ADAMW_BY_DEFAULT)
            and not any(fnmatch.fnmatchcase(name, pat) for pat in opt_cfg.adamw_params)
        ):
            muon.append((name, p))
        else:
            adamw.append((name, p))
    return muon, adamw


def check_patterns(names: list[str], opt_cfg) -> None:
    """Every muon_params / adamw_params pattern names at least one parameter of the model."""
    for key in ("muon_params", "adamw_params"):
        for pat in getattr(opt_cfg, key):
            if not any(fnmatch.fnmatchcase(n, pat) for n in names):
                raise ConfigError(
                    f"{OPT}.{key}: {pat!r} matches no parameter of the model (e.g."
                    f" {names[0]}, {names[len(names) // 2]}); fix the pattern"
                )


def newton_schulz(g: torch.Tensor, coefficients, steps: int, eps: float, dtype) -> torch.Tensor:
    """`steps` iterations of X <- a X + (b A + c A A) X, A = X X^T, from X = g / |g|_F (in
    `dtype`, on the wide orientation): near the orthogonal factor of g's polar decomposition.
    A 3-D g is a stack of matrices, each iterated alone (batched GEMMs, a norm per matrix)."""
    a, b, c = coefficients
    x = g.to(dtype)
    tall = g.size(-2) > g.size(-1)
    if tall:
        x = x.mT
    if x.ndim == 2:  # torch.optim.Muon's ops, so one rank's update is torch's bitwise
        x = x / x.norm().clamp(min=eps)
        for _ in range(steps):
            gram = x @ x.T
            poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)
            x = torch.addmm(x, poly, x, beta=a)
    else:
        x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
        for _ in range(steps):
            gram = x @ x.mT
            poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
            x = torch.baddbmm(x, poly, x, beta=a)
    return x.mT if tall else x


def adjusted_lr(lr: float, how: str, shape) -> float:
    """The lr of one matrix of global shape (..., rows, cols)."""
    rows, cols = shape[-2], shape[-1]
    if how == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(rows, cols))
    return lr * math.sqrt(max(1.0, rows / cols))


def _ns(g: torch.Tensor, args) -> torch.Tensor:
    return newton_schulz(g, *args)


class Muon(torch.optim.Optimizer):
    """Muon over (possibly sharded) 2-D parameters (module docstring)."""

    def __init__(self, params, opt_cfg):
        defaults = {
            "lr": opt_cfg.muon_lr,
            "momentum": opt_cfg.muon_momentum,
            "nesterov": opt_cfg.muon_nesterov,
            "weight_decay": opt_cfg.muon_weight_decay,
            "ns_steps": opt_cfg.muon_ns_steps,
            "ns_coefficients": tuple(opt_cfg.muon_ns_coefficients),
            "eps": opt_cfg.muon_eps,
            "adjust_lr_fn": opt_cfg.muon_adjust_lr_fn,
        }
        super().__init__(params, defaults)
        self.ns_dtype = NS_DTYPES[opt_cfg.ns_dtype]
        self.orthogonalize = Orthogonalizer(opt_cfg.muon_orthogonalize, self.ns_dtype)

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            lr, mom = group["lr"], group["momentum"]
            params, updates = [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad)
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - mom)
                params.append(p)
                updates.append(p.grad.lerp(buf, mom) if group["nesterov"] else buf)
            ns = functools.partial(
                _ns, args=(group["ns_coefficients"], group["ns_steps"], group["eps"], self.ns_dtype)
            )
            orthogonal = self.orthogonalize(updates, ns)
            for p, u, ortho in zip(params, updates, orthogonal):
                p.mul_(1 - lr * group["weight_decay"])
                p.add_(ortho.to(u.dtype), alpha=-adjusted_lr(lr, group["adjust_lr_fn"], p.shape))


class MuonAndAdamW(OptimizerList):
    """One model part's optimizers under optimizer.name = Muon: Muon over its matrices and
    AdamW over the rest (either left out when it has no parameter)."""

    def __init__(self, model, opt_cfg, adamw):
        from torchtitan.models.common.init import clean_fqn

        super().__init__()
        named = [(clean_fqn(n), p) for n, p in model.named_parameters()]
        muon, rest = split(named, opt_cfg)
        self.counts = (sum(p.numel() for _, p in muon), sum(p.numel() for _, p in rest))
        self.tensors = (len(muon), len(rest))
        self.muon = Muon([p for _, p in muon], opt_cfg) if muon else None
        if muon:
            self.append(self.muon)
        if rest:
            self.append(adamw([p for _, p in rest]))

    def where(self) -> str:
        """Where Muon iterates this part's matrices (muon_owners.Orthogonalizer.describe),
        and a word when its bfloat16 GEMMs will crawl (a CPU without bf16 instructions)."""
        if self.muon is None:
            return "Muon has no matrix here"
        params = [p for g in self.muon.param_groups for p in g["params"]]
        line = self.muon.orthogonalize.describe(params)
        on_cpu = params[0].device.type == "cpu"
        if on_cpu and self.muon.ns_dtype == torch.bfloat16 and not cpu_has_bf16_gemm():
            line += (
                ". This CPU has no bf16 instructions: bfloat16 Newton-Schulz runs ~40x slower"
                " than float32 here (--optimizer.ns_dtype=float32)"
            )
        return line


def cpu_has_bf16_gemm() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX-512 BF16 or AMX; Linux's flags)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return True  # unknown: say nothing
    return "avx512_bf16" in flags or "amx_bf16" in flags
