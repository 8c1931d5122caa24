"""[comm] hang_timeout_seconds, --checkpoint.async_mode and TORCHTITAN_FAULT through the config loader (world size 2)."""

import pytest

from torchtitan.config import load_config

from config_helpers import config_error

HANG = ("must be below --comm.timeout_seconds={t} (the report comes before the collective timeout ends the job),"
        " 0 to turn the watchdog off, or -1 for 60% of timeout_seconds")


@pytest.fixture(autouse=True)
def no_fault(monkeypatch):
    monkeypatch.delenv("TORCHTITAN_FAULT", raising=False)


@pytest.mark.parametrize("argv, hang, resolved", [
    ([], -1, 180.0),
    (["--comm.timeout_seconds=100"], -1, 60.0),
    (["--comm.hang_timeout_seconds=0"], 0, 0.0),
    (["--comm.hang_timeout_seconds=45"], 45, 45.0),
    (["--comm.hang_timeout_seconds=299"], 299, 299.0),
])
def test_hang_timeout_resolved(argv, hang, resolved):
    cfg, _ = load_config(argv, 2)
    assert cfg.comm.hang_timeout_seconds == hang
    assert cfg.comm.resolved_hang_timeout() == resolved


@pytest.mark.parametrize("argv, value, timeout", [
    (["--comm.hang_timeout_seconds=300"], 300, 300),
    (["--comm.hang_timeout_seconds=500"], 500, 300),
    (["--comm.timeout_seconds=60", "--comm.hang_timeout_seconds=60"], 60, 60),
    (["--comm.hang_timeout_seconds=-2"], -2, 300),
])
def test_hang_timeout_refused(argv, value, timeout):
    assert config_error(argv, world_size=2) == f"--comm.hang_timeout_seconds={value}: " + HANG.format(t=timeout)


def test_async_mode_needs_checkpointing(tmp_path):
    assert config_error([f"--job.dump_folder={tmp_path}", "--checkpoint.async_mode=async"], world_size=2) == (
        "--checkpoint.async_mode=async has no effect without --checkpoint.enable=true; enable checkpointing or drop it")


def test_async_mode_with_checkpointing(tmp_path):
    cfg, _ = load_config([f"--job.dump_folder={tmp_path}", "--checkpoint.enable=true",
                          "--checkpoint.async_mode=async"], 2)
    assert (cfg.checkpoint.enable, cfg.checkpoint.async_mode) == (True, "async")
    assert load_config([], 2)[0].checkpoint.async_mode == "disabled"


def test_bad_fault_variable_refused(monkeypatch):
    monkeypatch.setenv("TORCHTITAN_FAULT", "stop@data;freeze@step:rank=1")
    assert config_error([], world_size=2) == (
        "TORCHTITAN_FAULT: 'freeze@step:rank=1': use stop@<point> or sleep=<seconds>@<point>, point one of data,"
        " step, checkpoint_write; unset it outside the failure tests")


def test_good_fault_variable_accepted(monkeypatch):
    monkeypatch.setenv("TORCHTITAN_FAULT", "stop@data:rank=1:step=4; sleep=30@checkpoint_write:step=6")
    load_config([], 2)
