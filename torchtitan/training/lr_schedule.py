"""The learning-rate schedule ([lr_scheduler]): linear warmup, a flat phase, then a decay."""

import math

from torch.optim.lr_scheduler import LambdaLR


def schedule_steps(lr_cfg, training_steps: int) -> int:
    """The schedule's length: lr_scheduler.total_steps, auto = training.steps."""
    total = lr_cfg.total_steps
    return training_steps if total == "auto" else int(total)


def decay_shape(decay_type: str, progress: float) -> float:
    """1.0 at the start of the decay (progress 0) down to 0.0 at its end (progress 1)."""
    if decay_type == "cosine":
        return 0.5 * (1 + math.cos(math.pi * progress))
    if decay_type == "sqrt":  # upstream's 1 - sqrt(progress): fast at first, then slower
        return 1.0 - math.sqrt(progress)
    return 1.0 - progress


def lr_factor(step: int, total_steps: int, cfg) -> float:
    """Multiplier of the peak lr at optimizer step `step` (0-based).

    Warmup: (step + 1) / (warmup + 1) for the first warmup_steps steps. Then a flat phase at
    1.0 and, over the last round((total - warmup) x decay_ratio) steps, a linear, sqrt or
    cosine decay that starts at 1.0 and reaches min_lr_factor exactly on the last step
    (total - 1); steps past the end stay there.
    """
    warmup = cfg.warmup_steps
    if step < warmup:
        return (step + 1) / (warmup + 1)
    decay_steps = round((total_steps - warmup) * cfg.decay_ratio)
    decay_start = total_steps - decay_steps
    if decay_steps <= 0 or step < decay_start:
        return 1.0
    progress = 1.0 if decay_steps == 1 else min(1.0, (step - decay_start) / (decay_steps - 1))
    shape = decay_shape(cfg.decay_type, progress)
    return cfg.min_lr_factor + (1 - cfg.min_lr_factor) * shape


def build_lr_scheduler(optimizer, total_steps: int, cfg) -> LambdaLR:
    return LambdaLR(optimizer, lambda step: lr_factor(step, total_steps, cfg))
