"""AdamW over the model's (possibly sharded) parameters, and the warmup + decay schedule."""

import math

import torch
from torch.optim.lr_scheduler import LambdaLR


def kernels(opt_cfg, device_type: str) -> str:
    """[optimizer] implementation with auto resolved: fused on CUDA, foreach elsewhere."""
    if opt_cfg.implementation != "auto":
        return opt_cfg.implementation
    return "fused" if device_type == "cuda" else "foreach"


def build_optimizer(params, opt_cfg, device_type: str = "cpu") -> torch.optim.Optimizer:
    fused = kernels(opt_cfg, device_type) == "fused"
    return torch.optim.AdamW(
        params,
        lr=opt_cfg.lr,
        betas=(opt_cfg.beta1, opt_cfg.beta2),
        eps=opt_cfg.eps,
        weight_decay=opt_cfg.weight_decay,
        foreach=None if fused else True,
        fused=fused or None,
    )


def lr_factor(step: int, total_steps: int, cfg) -> float:
    """Multiplier of the peak lr at optimizer step `step` (0-based).

    Warmup: (step + 1) / (warmup + 1) for the first warmup_steps steps. Then a flat phase at
    1.0 and, over the last round((total - warmup) x decay_ratio) steps, a linear or cosine
    decay that starts at 1.0 and reaches min_lr_factor exactly on the last step (total - 1).
    """
    warmup = cfg.warmup_steps
    if step < warmup:
        return (step + 1) / (warmup + 1)
    decay_steps = round((total_steps - warmup) * cfg.decay_ratio)
    decay_start = total_steps - decay_steps
    if decay_steps == 0 or step < decay_start:
        return 1.0
    progress = 1.0 if decay_steps == 1 else min(1.0, (step - decay_start) / (decay_steps - 1))
    if cfg.decay_type == "cosine":
        shape = 0.5 * (1 + math.cos(math.pi * progress))
    else:
        shape = 1.0 - progress
    return cfg.min_lr_factor + (1 - cfg.min_lr_factor) * shape


def build_lr_scheduler(optimizer, total_steps: int, cfg) -> LambdaLR:
    return LambdaLR(optimizer, lambda step: lr_factor(step, total_steps, cfg))


class PartOptimizers:
    """One AdamW and one LR schedule per model part (pipeline stage).

    Checkpoints are keyed by parameter name through torch's get/set_optimizer_state_dict,
    which maps one model to one optimizer; an optimizer per part keeps that mapping exact
    however the stages are split, so optimizer state loads into any other layout. AdamW is
    elementwise, so splitting it by part changes no number.
    """

    def __init__(self, model_parts, opt_cfg, total_steps: int, lr_cfg, device_type: str = "cpu"):
        self.optimizers = [
            build_optimizer(list(m.parameters()), opt_cfg, device_type) for m in model_parts
        ]
        self.schedulers = [build_lr_scheduler(o, total_steps, lr_cfg) for o in self.optimizers]

    def step(self) -> None:
        for o in self.optimizers:
            o.step()
        for s in self.schedulers:
            s.step()

    def last_lr(self) -> float:
        return self.schedulers[0].get_last_lr()[0]
