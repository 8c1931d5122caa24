"""optimizer.early_step_in_backward: one AdamW per parameter, stepped by its gradient hook
inside backward (FSDP2 on a 1-rank gloo group, as every run applies it), against the plain
step after backward: the same parameters bitwise, the same gradient norm, no gradient left
after backward, the schedule stepping every optimizer, the DCP optimizer state saved and
loaded by parameter name; and the pre-launch refusals (checks/optimizer.py)."""

from types import SimpleNamespace as NS

import pytest
import torch
from config_helpers import cfg_of
from torch import nn

from torchtitan.checks.optimizer import check_optimizer_placement
from torchtitan.config import ConfigError
from torchtitan.distributed.grad_norm import clip_grad_norm_
from torchtitan.training.optimizer import InBackward, PartOptimizers

STEPS = 4


def _opt_cfg(early: bool):
    return NS(
        name="AdamW",
        implementation="foreach",
        lr=0.01,
        beta1=0.9,
        beta2=0.95,
        eps=1e-8,
        weight_decay=0.1,
        early_step_in_backward=early,
    )


LR = NS(warmup_steps=2, decay_ratio=0.5, decay_type="linear", min_lr_factor=0.1)


def _model(fsdp: bool):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8), nn.Linear(8, 1))
    if fsdp:
        mesh = init_device_mesh("cpu", (1,))
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    return model


def _train(early: bool, fsdp: bool):
    model = _model(fsdp)
    opts = PartOptimizers([model], _opt_cfg(early), 10, LR)
    norms, left = [], []
    for step in range(STEPS):
        torch.manual_seed(100 + step)
        model.zero_grad(set_to_none=True)
        model(torch.randn(5, 8)).square().mean().backward()
        left.append(sum(p.grad is not None for p in model.parameters()))
        norms.append(
            opts.grad_norm(torch.device("cpu"))
            if early
            else clip_grad_norm_(list(model.parameters()), 0.0)
        )
        opts.step()
    return model, opts, norms, left


@pytest.mark.parametrize("fsdp", [False, True])
def test_stepping_in_backward_equals_the_plain_step(fsdp, gloo_world):
    plain, plain_opts, plain_norms, plain_left = _train(False, fsdp)
    early, early_opts, early_norms, early_left = _train(True, fsdp)
    params = list(early.parameters())
    assert early_left == [0] * STEPS and plain_left == [len(params)] * STEPS  # freed in backward
    for a, b in zip(plain.parameters(), params):
        assert torch.equal(a.detach(), b.detach())  # AdamW is elementwise: bitwise
    for a, b in zip(plain_norms, early_norms):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=0)
    assert isinstance(early_opts.optimizers[0], InBackward)
    assert len(early_opts.optimizers[0]) == len(params) == len(early_opts.schedulers)
    lrs = {g["lr"] for o in early_opts.optimizers[0] for g in o.param_groups}
    assert lrs == {plain_opts.optimizers[0].param_groups[0]["lr"]}  # every schedule stepped
    assert early_opts.last_lr() == plain_opts.last_lr()


def test_dcp_state_round_trips_by_parameter_name(gloo_world):
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    flat = StateDictOptions(flatten_optimizer_state_dict=True)
    model, opts, _, _ = _train(True, fsdp=True)
    saved = get_optimizer_state_dict(model, opts.optimizers[0], options=flat)
    plain, plain_opts, _, _ = _train(False, fsdp=True)
    want = get_optimizer_state_dict(plain, plain_opts.optimizers[0], options=flat)
    assert sorted(saved) == sorted(want)  # the same keys as one AdamW: loads into either
    assert all(torch.equal(saved[k], want[k]) for k in want if isinstance(want[k], torch.Tensor))
    fresh = _model(fsdp=True)
    fresh_opts = PartOptimizers([fresh], _opt_cfg(True), 10, LR)
    set_optimizer_state_dict(fresh, fresh_opts.optimizers[0], saved, options=flat)
    loaded = get_optimizer_state_dict(fresh, fresh_opts.optimizers[0], options=flat)
    assert all(
        torch.equal(loaded[k], saved[k]) for k in saved if isinstance(saved[k], torch.Tensor)
    )


EARLY = "--optimizer.early_step_in_backward"
NO_CLIP = "--training.max_norm=0"


@pytest.mark.parametrize(
    "argv, dp_shard, what, fix",
    [
        (
            ["--parallelism.pipeline_parallel_degree=2", NO_CLIP],
            1,
            "--parallelism.pipeline_parallel_degree=2",
            "set it to 1",
        ),
        (
            ["--parallelism.expert_parallel_degree=2", NO_CLIP],
            1,
            "--parallelism.expert_parallel_degree=2",
            "set it to 1",
        ),
        (
            ["--fault_tolerance.enable", NO_CLIP],
            1,
            "--fault_tolerance.enable",
            "turn fault tolerance off",
        ),
        (
            [NO_CLIP, "--training.local_batch_size=2", "--training.global_batch_size=8"],
            2,  # dp_shard 2: 8 rows = 2 x 2 x 2 passes
            "2 gradient-accumulation steps (each backward would step)",
            "make global_batch_size = local_batch_size x the data-parallel degree",
        ),
    ],
)
def test_early_step_refusals(argv, dp_shard, what, fix):
    with pytest.raises(ConfigError) as info:
        check_optimizer_placement(cfg_of([EARLY, *argv]), dp_shard)
    assert str(info.value) == (
        f"{EARLY} steps each parameter inside backward: not with {what}; {fix}"
    )
    check_optimizer_placement(cfg_of(argv), dp_shard)  # each is fine without the early step


def test_early_step_without_clipping_passes_and_offload_refuses_simple_fsdp():
    check_optimizer_placement(cfg_of([EARLY, NO_CLIP]), 1)
    one_pass = ["--training.local_batch_size=2", "--training.global_batch_size=8"]
    check_optimizer_placement(cfg_of([EARLY, NO_CLIP, *one_pass]), 4)  # 8 = 2 x 4: one pass
    with pytest.raises(ConfigError) as info:
        check_optimizer_placement(
            cfg_of(
                ["--training.enable_cpu_offload", "--parallelism.fsdp_implementation=simple_fsdp"]
            ),
            1,
        )
    assert str(info.value) == (
        "--training.enable_cpu_offload is FSDP2's CPUOffloadPolicy and"
        " --parallelism.fsdp_implementation=simple_fsdp has none; use fsdp2 or turn offload off"
    )


def test_early_step_with_clipping_trains_unclipped_and_says_so_in_one_warning():
    from torchtitan.checks import load_config
    from torchtitan.checks.optimizer import early_step_clip_warning

    clip = [EARLY, "--training.max_norm=1.0"]
    check_optimizer_placement(cfg_of(clip), 1)  # accepted, as upstream accepts it
    _, warnings = load_config(clip, 1)
    assert warnings == [
        "--training.max_norm=1.0 is not applied with --optimizer.early_step_in_backward: each"
        " parameter steps in its gradient hook before a global norm exists (upstream skips"
        " clipping the same way); the logged grad_norm is the unclipped norm. Set"
        " --training.max_norm=0 to silence this"
    ]
    assert early_step_clip_warning(cfg_of([EARLY, NO_CLIP])) is None
    assert early_step_clip_warning(cfg_of(["--training.max_norm=1.0"])) is None
