"""The memory prediction against its deterministic reference, and its pure parts.

Reference: the same training step on REAL tensors in one process on the fake process group
(collectives move nothing: no gloo temporaries, no timing), measured by the CPU allocator's
own events (torch profiler). The prediction runs the step on fake tensors. Goal: within
+/-5% for every pipeline rank (measured: equal to the byte but for AdamW's step counters).
The matrix of real gloo jobs is scripts/memory_check.py.
"""

import json
import os
import subprocess
import sys

import pytest

from torchtitan.config import ConfigError

from torchtitan.checks import load_config
from torchtitan.memory.simulation_patches import planned_splits

HERE = os.path.dirname(os.path.abspath(__file__))
TINY = ["--model.flavor=tiny", "--training.seq_len=64", "--training.mixed_precision_param=float32"]
DSV3 = ["--job.config_file=train_configs/deepseek_v3_debug.toml", *TINY]

CASES = {
    "fsdp2": (2, [*TINY, "--training.local_batch_size=2"]),
    "simple_fsdp": (2, [*TINY, "--training.local_batch_size=2", "--parallelism.fsdp_implementation=simple_fsdp"]),
    "simple_fsdp_op_sac": (2, [*TINY, "--training.local_batch_size=2", "--parallelism.fsdp_implementation=simple_fsdp",
                               "--activation_checkpoint.mode=selective"]),
    "tp2_full_ac": (4, [*TINY, "--training.local_batch_size=2", "--parallelism.tensor_parallel_degree=2",
                        "--activation_checkpoint.mode=full"]),
    "pp2_1f1b_op_sac": (4, [*TINY, "--training.local_batch_size=4", "--parallelism.pipeline_parallel_degree=2",
                            "--activation_checkpoint.mode=selective"]),
    "ddp_accum": (2, [*TINY, "--training.local_batch_size=2", "--parallelism.data_parallel_shard_degree=1",
                      "--parallelism.data_parallel_replicate_degree=2", "--training.global_batch_size=8"]),
    "dsv3_ep2": (4, [*DSV3, "--training.local_batch_size=2", "--parallelism.expert_parallel_degree=2"]),
    # context parallel (gathered K/V, chunk masks) with the document mask
    "cp2_block_causal": (2, [*TINY, "--training.local_batch_size=2", "--parallelism.context_parallel_degree=2",
                             "--model.attn_mask=block_causal"]),
}


# A gap of the reference, not of the prediction: on the fake process group the work object of
# SimpleFSDP's all-gather keeps the gather's flat input (a copy of the unit's local shards)
# alive, so the allocator holds one more copy of every local shard than a real gloo run does
# (+9.5% here). On real gloo the prediction is exact to the KiB:
# tests/integration/test_memory_budget.py::test_prediction_against_a_real_gloo_run.
KNOWN_GAPS = {"simple_fsdp", "simple_fsdp_op_sac"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason="known gap, see KNOWN_GAPS"))
                                  if n in KNOWN_GAPS else n for n in CASES])
def test_prediction_matches_the_allocator_on_real_tensors(name):
    world, argv = CASES[name]
    proc = subprocess.run([sys.executable, os.path.join(HERE, "memory_worker.py"), str(world), *argv],
                          capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(HERE)), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert rows, proc.stdout[-2000:]
    for row in rows:
        error = (row["predicted"] - row["allocator"]) / row["allocator"]
        assert abs(error) <= 0.05, (name, row)
        # the breakdown accounts for every byte of the peak
        assert sum(row["breakdown"].values()) == row["predicted"], (name, row)


@pytest.mark.parametrize("rows,world,skew,send,recv", [
    (8, 2, 1.0, [4, 4], [4, 4]),
    (7, 2, 1.0, [4, 3], [4, 3]),
    (8, 4, 4.0, [2, 2, 2, 2], [8, 8, 8, 8]),  # every copy of the group comes here
    (8, 4, 2.0, [2, 2, 2, 2], [4, 4, 4, 4]),
    (8, 2, 9.0, [4, 4], [8, 8]),  # never more than the group sends
])
def test_planned_expert_parallel_splits(rows, world, skew, send, recv):
    got_send, got_recv = planned_splits(rows, world, 0, skew)
    assert (got_send, got_recv) == (send, recv)
    assert sum(got_send) == rows


@pytest.mark.parametrize("argv,message", [
    (["--job.fit=local_batch_size"],
     "--job.fit=local_batch_size searches with the prediction of a dry run; add --job.dry_run=true"),
    (["--moe.memory_skew=0.5"], "--moe.memory_skew=0.5: must be >= 1 (1 = balanced routing; the expert-parallel"
                                " degree = every token copy on one rank)"),
])
def test_bad_memory_keys_are_one_line(argv, message):
    with pytest.raises(ConfigError) as info:
        load_config(argv, 1)
    assert str(info.value) == message


def test_async_checkpoint_staging_is_counted_only_where_it_is_memory():
    from types import SimpleNamespace as NS

    import torch

    from torchtitan.memory.simulate import checkpoint_staging_bytes

    params = [torch.zeros(10), torch.zeros(300)[:200]]  # storages of 40 and 1200 bytes (a view of a padded one)
    at_peak = {"parameters": 1240, "optimizer_states": 2480, "activations": 9999}

    def cfg(enable=True, mode="async", interval=5, steps=10):
        return NS(checkpoint=NS(enable=enable, async_mode=mode, interval=interval), training=NS(steps=steps))

    # the staged copy of parameters and optimizer states, plus the largest storage while DCP writes it
    assert checkpoint_staging_bytes(cfg(), "cpu", at_peak, params) == 1240 + 2480 + 1200
    assert checkpoint_staging_bytes(cfg(), "cuda", at_peak, params) == 0  # host memory there
    assert checkpoint_staging_bytes(cfg(mode="disabled"), "cpu", at_peak, params) == 0
    assert checkpoint_staging_bytes(cfg(enable=False), "cpu", at_peak, params) == 0
    assert checkpoint_staging_bytes(cfg(interval=10), "cpu", at_peak, params) == 0  # only the last save: synchronous
