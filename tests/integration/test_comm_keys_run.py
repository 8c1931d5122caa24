"""Upstream's [comm] and [memory_estimation] keys in a real 2-rank run: the collective
timeout changes after the first step (train_timeout_seconds) and every rank role's predicted
peak is printed before the first step (memory_estimation.enable)."""

import os
import re

import pytest
import run_tests

from torchtitan.checks import load_config
from torchtitan.config import ConfigError
from torchtitan.distributed.process_groups import flight_recorder_env


def test_train_timeout_and_memory_estimation_in_a_run(tmp_path):
    rc, _, out = run_tests.launch(
        2,
        [
            "--model.flavor=tiny",
            "--training.steps=3",
            "--training.seq_len=64",
            "--training.local_batch_size=2",
            f"--job.dump_folder={tmp_path}",
            "--metrics.enable_tensorboard=false",
            "--memory_estimation.enable",
            "--comm.train_timeout_seconds=100",
        ],
        str(tmp_path / "ranks"),
    )
    assert rc == 0, out[-3000:]
    estimates = re.findall(
        r"memory estimation: role (\S+) \(ranks ([\d,\-]+)\): predicted peak", out
    )
    assert estimates == [("all", "0,1")]
    # printed before the first step
    assert out.index("memory estimation:") < out.index("step 1/3")
    # the world's group and the mesh's dp_shard group, from step 2 on
    lines = re.findall(
        r"collective timeout from step (\d+) on: (\d+) s on (\d+) process groups", out
    )
    assert lines == [("2", "100", "2")]


def test_flight_recorder_env_and_timeout_checks(tmp_path):
    cfg, _ = load_config(["--comm.trace_buf_size=500", "--comm.save_traces_file_prefix=r"], 1)
    env = flight_recorder_env(cfg.comm, str(tmp_path))
    assert env == {
        "TORCH_FR_BUFFER_SIZE": "500",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_DUMP_TEMP_FILE": os.path.join(str(tmp_path), "comm_traces", "r"),
    }
    cfg, _ = load_config(["--comm.trace_buf_size=0"], 1)
    assert flight_recorder_env(cfg.comm, str(tmp_path)) == {}
    with pytest.raises(ConfigError, match=r"--comm.train_timeout_seconds=0: must be >= 1 or auto"):
        load_config(["--comm.train_timeout_seconds=0"], 1)
    # a hang report must come before the shorter (train) timeout
    with pytest.raises(ConfigError, match=r"with --comm.train_timeout_seconds=30: a hang report"):
        load_config(["--comm.train_timeout_seconds=30", "--comm.hang_timeout_seconds=29"], 1)
