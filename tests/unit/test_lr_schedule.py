"""The warmup + stable + decay learning-rate factor, and the optimizer / scheduler it drives."""

import math

import pytest
import torch

from torchtitan.config.job_config import LRScheduler, Optimizer
from torchtitan.training.optimizer import build_lr_scheduler, build_optimizer, lr_factor


def sched(**kw) -> LRScheduler:
    return LRScheduler(**kw)


def factors(total, cfg, upto=None):
    return [lr_factor(s, total, cfg) for s in range(total if upto is None else upto)]


@pytest.mark.parametrize("warmup", [1, 2, 4, 7])
def test_warmup_is_linear_and_reaches_peak_when_it_ends(warmup):
    cfg = sched(warmup_steps=warmup)
    f = factors(20, cfg, upto=warmup + 1)
    assert f == pytest.approx([(s + 1) / (warmup + 1) for s in range(warmup + 1)], abs=1e-12)
    assert f[0] > 0  # the first step never has lr 0
    steps = [b - a for a, b in zip(f, f[1:])]
    assert steps == pytest.approx([1 / (warmup + 1)] * warmup, abs=1e-12)
    assert all(x < 1.0 for x in f[:warmup])
    assert f[warmup] == 1.0


def test_no_warmup_starts_at_peak():
    assert lr_factor(0, 10, sched(warmup_steps=0)) == 1.0


def test_linear_decay_values():
    # 10 steps, 2 of warmup: 8 decay steps from 1.0 at step 2 down to 0.0 at step 9.
    cfg = sched(warmup_steps=2, decay_type="linear", min_lr_factor=0.0)
    assert factors(10, cfg)[2:] == pytest.approx([1 - (s - 2) / 7 for s in range(2, 10)], abs=1e-12)
    assert lr_factor(9, 10, cfg) == 0.0
    assert lr_factor(25, 10, cfg) == 0.0  # clamped past the end


def test_cosine_decay_values_with_floor():
    cfg = sched(warmup_steps=3, decay_type="cosine", min_lr_factor=0.1)
    expected = [0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (s - 3) / 6)) for s in range(3, 10)]
    assert factors(10, cfg)[3:] == pytest.approx(expected, abs=1e-12)
    assert lr_factor(9, 10, cfg) == pytest.approx(0.1, abs=1e-12)


@pytest.mark.parametrize("decay_type", ["linear", "cosine"])
@pytest.mark.parametrize("min_lr", [0.0, 0.1, 0.5])
def test_decay_is_monotone_and_ends_on_the_floor(decay_type, min_lr):
    cfg = sched(warmup_steps=2, decay_type=decay_type, min_lr_factor=min_lr)
    after = factors(20, cfg)[2:]
    assert after[0] == 1.0
    assert all(b < a for a, b in zip(after, after[1:]))
    assert all(x > min_lr for x in after[:-1])
    assert after[-1] == pytest.approx(min_lr, abs=1e-12)


def test_decay_ratio_below_one_keeps_a_flat_phase():
    # 12 steps, 2 warmup, decay_ratio 0.4 -> 4 decay steps (8..11), flat 2..7.
    cfg = sched(warmup_steps=2, decay_ratio=0.4, decay_type="linear", min_lr_factor=0.0)
    f = factors(12, cfg)
    assert f[2:8] == [1.0] * 6
    assert f[8:] == pytest.approx([1.0, 2 / 3, 1 / 3, 0.0], abs=1e-12)


def test_single_decay_step_lands_on_the_floor():
    cfg = sched(warmup_steps=0, decay_ratio=0.1, decay_type="linear", min_lr_factor=0.25)
    f = factors(10, cfg)
    assert f[:9] == [1.0] * 9
    assert f[9] == pytest.approx(0.25, abs=1e-12)


def test_decay_ratio_zero_never_decays_during_training():
    cfg = sched(warmup_steps=2, decay_ratio=0.0)
    assert factors(10, cfg)[2:] == [1.0] * 8


def test_scheduler_gives_the_trainer_peak_times_factor():
    """What the train loop sees: get_last_lr() before each optimizer step, then scheduler.step()."""
    p = torch.nn.Parameter(torch.zeros(3))
    opt_cfg = Optimizer(lr=0.5)
    cfg = sched(warmup_steps=3, decay_type="cosine", min_lr_factor=0.2)
    optimizer = build_optimizer([p], opt_cfg)
    scheduler = build_lr_scheduler(optimizer, 12, cfg)
    seen = []
    for _ in range(12):
        seen.append(scheduler.get_last_lr()[0])
        assert optimizer.param_groups[0]["lr"] == seen[-1]
        p.grad = torch.ones(3)
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx([0.5 * lr_factor(s, 12, cfg) for s in range(12)], abs=1e-12)


def test_build_optimizer_uses_the_config():
    p = torch.nn.Parameter(torch.zeros(2))
    cfg = Optimizer(lr=3e-4, eps=1e-6, beta1=0.8, beta2=0.9, weight_decay=0.05)
    opt = build_optimizer([p], cfg)
    assert isinstance(opt, torch.optim.AdamW)
    group = opt.param_groups[0]
    assert group["lr"] == 3e-4 and group["eps"] == 1e-6
    assert group["betas"] == (0.8, 0.9) and group["weight_decay"] == 0.05
    assert group["foreach"] is True


@pytest.mark.parametrize("decay_type", ["linear", "cosine"])
@pytest.mark.parametrize("decay_ratio", [1.0, 0.5])
def test_decay_ends_at_min_lr_factor_on_the_last_step(decay_type, decay_ratio):
    total = 10
    cfg = sched(warmup_steps=2, decay_type=decay_type, decay_ratio=decay_ratio, min_lr_factor=0.1)
    assert lr_factor(total - 1, total, cfg) == pytest.approx(0.1, abs=1e-12)


def test_adamw_kernels_fused_on_cuda_foreach_elsewhere():
    from torchtitan.config.job_config import Optimizer
    from torchtitan.training.optimizer import build_optimizer, kernels

    auto = Optimizer()
    assert kernels(auto, "cuda") == "fused" and kernels(auto, "cpu") == "foreach"
    assert kernels(Optimizer(implementation="foreach"), "cuda") == "foreach"
    p = torch.nn.Parameter(torch.zeros(2))
    cpu = build_optimizer([p], auto, "cpu").defaults
    assert cpu["foreach"] is True and not cpu["fused"]
    fused = build_optimizer(
        [p], Optimizer(implementation="fused"), "cpu"
    ).defaults  # fused AdamW runs on CPU too
    assert fused["fused"] is True and not fused["foreach"]
