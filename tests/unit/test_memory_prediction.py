"""The memory prediction's pure parts: planned expert-parallel splits, one-line errors of its
keys, the asynchronous checkpoint's staging. (The prediction against its deterministic
reference, the same step on real tensors measured by the CPU allocator, in child processes
on the fake process group: tests/integration/test_memory_fake_world.py.)"""

import pytest

from torchtitan.checks import load_config
from torchtitan.config import ConfigError
from torchtitan.planning.simulate.patches import planned_splits


@pytest.mark.parametrize(
    "rows,world,skew,send,recv",
    [
        (8, 2, 1.0, [4, 4], [4, 4]),
        (7, 2, 1.0, [4, 3], [4, 3]),
        (8, 4, 4.0, [2, 2, 2, 2], [8, 8, 8, 8]),  # every copy of the group comes here
        (8, 4, 2.0, [2, 2, 2, 2], [4, 4, 4, 4]),
        (8, 2, 9.0, [4, 4], [8, 8]),  # never more than the group sends
    ],
)
def test_planned_expert_parallel_splits(rows, world, skew, send, recv):
    got_send, got_recv = planned_splits(rows, world, 0, skew)
    assert (got_send, got_recv) == (send, recv)
    assert sum(got_send) == rows


@pytest.mark.parametrize(
    "argv,message",
    [
        (
            ["--planning.fit=local_batch_size"],
            "--planning.fit=local_batch_size searches with the prediction of a dry run; add --job.dry_run=true",
        ),
        (
            ["--planning.memory_skew=0.5"],
            "--planning.memory_skew=0.5: must be >= 1 (1 = balanced routing; the expert-parallel"
            " degree = every token copy on one rank)",
        ),
    ],
)
def test_bad_memory_keys_are_one_line(argv, message):
    with pytest.raises(ConfigError) as info:
        load_config(argv, 1)
    assert str(info.value) == message


def test_cpu_offload_takes_the_sharded_states_off_the_device_peak():
    from types import SimpleNamespace as NS

    from torchtitan.planning.simulate.step import host_offloaded_bytes

    def at_peak():
        return {
            "parameters": 100,
            "gradients": 100,
            "optimizer_states": 200,
            "optimizer_transients": 50,
            "unsharded_parameters": 400,
            "activations": 900,
        }

    cfg = NS(training=NS(enable_cpu_offload=True))
    breakdown = at_peak()
    assert host_offloaded_bytes(cfg, "cuda", breakdown) == 450
    assert breakdown == {
        **at_peak(),
        **dict.fromkeys(("parameters", "gradients", "optimizer_states", "optimizer_transients"), 0),
    }  # what FSDP2 gathers to the device and the activations stay
    breakdown = at_peak()
    assert host_offloaded_bytes(cfg, "cpu", breakdown) == 0 and breakdown == at_peak()
    off = NS(training=NS(enable_cpu_offload=False))
    assert host_offloaded_bytes(off, "cuda", breakdown) == 0 and breakdown == at_peak()


def test_async_checkpoint_staging_is_counted_only_where_it_is_memory():
    from types import SimpleNamespace as NS

    import torch

    from torchtitan.planning.simulate.step import checkpoint_staging_bytes

    params = [
        torch.zeros(10),
        torch.zeros(300)[:200],
    ]  # storages of 40 and 1200 bytes (a view of a padded one)
    at_peak = {"parameters": 1240, "optimizer_states": 2480, "activations": 9999}

    def cfg(enable=True, mode="async", interval=5, steps=10):
        return NS(
            checkpoint=NS(enable=enable, async_mode=mode, interval=interval),
            training=NS(steps=steps),
        )

    # the staged copy of parameters and optimizer states, plus the largest storage while DCP writes it
    assert checkpoint_staging_bytes(cfg(), "cpu", at_peak, params) == 1240 + 2480 + 1200
    assert checkpoint_staging_bytes(cfg(), "cuda", at_peak, params) == 0  # host memory there
    assert checkpoint_staging_bytes(cfg(mode="disabled"), "cpu", at_peak, params) == 0
    assert checkpoint_staging_bytes(cfg(enable=False), "cpu", at_peak, params) == 0
    assert (
        checkpoint_staging_bytes(cfg(interval=10), "cpu", at_peak, params) == 0
    )  # only the last save: synchronous
