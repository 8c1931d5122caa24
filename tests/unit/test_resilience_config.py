"""[comm] hang_timeout_seconds, --checkpoint.async_mode and TORCHTITAN_FAULT through the config loader (world size 2)."""

import pytest
from config_helpers import config_error

from torchtitan.checks import load_config
from torchtitan.resilience.timeouts import hang_timeout

HANG = (
    "must be auto, 0 (off) or seconds ({allowed} with --comm.timeout_seconds={t}: a hang report takes up"
    " to 6 heartbeat intervals more, and must come before the collective timeout ends the job)"
)


@pytest.fixture(autouse=True)
def no_fault(monkeypatch):
    monkeypatch.delenv("TORCHTITAN_FAULT", raising=False)


@pytest.mark.parametrize(
    "argv, hang, resolved",
    [
        ([], "auto", 180.0),
        (["--comm.timeout_seconds=100"], "auto", 60.0),
        (["--comm.hang_timeout_seconds=0"], 0, 0.0),
        (["--comm.hang_timeout_seconds=45"], 45, 45.0),
        (
            ["--comm.hang_timeout_seconds=238"],
            238,
            238.0,
        ),  # the longest that leaves time for the report
        (
            ["--comm.timeout_seconds=20"],
            "auto",
            11.0,
        ),  # 60% (12 s) would report too late: the longest that fits
        (["--comm.timeout_seconds=5"], "auto", 0.0),  # no time for a report: off
    ],
)
def test_hang_timeout_resolved(argv, hang, resolved):
    cfg, _ = load_config(argv, 2)
    assert cfg.comm.hang_timeout_seconds == hang
    assert hang_timeout(cfg.comm) == resolved


@pytest.mark.parametrize(
    "argv, value, timeout, allowed",
    [
        (["--comm.hang_timeout_seconds=239"], 239, 300, "1..238"),
        (["--comm.hang_timeout_seconds=500"], 500, 300, "1..238"),
        (["--comm.timeout_seconds=60", "--comm.hang_timeout_seconds=60"], 60, 60, "1..36"),
        (["--comm.hang_timeout_seconds=-2"], -2, 300, "1..238"),
        (["--comm.timeout_seconds=5", "--comm.hang_timeout_seconds=3"], 3, 5, "none"),
    ],
)
def test_hang_timeout_refused(argv, value, timeout, allowed):
    assert config_error(
        argv, world_size=2
    ) == f"--comm.hang_timeout_seconds={value}: " + HANG.format(t=timeout, allowed=allowed)


def test_async_mode_needs_checkpointing(tmp_path):
    assert config_error(
        [f"--job.dump_folder={tmp_path}", "--checkpoint.async_mode=async"], world_size=2
    ) == (
        "--checkpoint.async_mode=async has no effect without --checkpoint.enable=true; enable checkpointing or drop it"
    )


def test_async_mode_with_checkpointing(tmp_path):
    cfg, _ = load_config(
        [
            f"--job.dump_folder={tmp_path}",
            "--checkpoint.enable=true",
            "--checkpoint.async_mode=async",
        ],
        2,
    )
    assert (cfg.checkpoint.enable, cfg.checkpoint.async_mode) == (True, "async")
    assert load_config([], 2)[0].checkpoint.async_mode == "disabled"


def test_bad_fault_variable_refused(monkeypatch):
    monkeypatch.setenv("TORCHTITAN_FAULT", "stop@data;freeze@step:rank=1")
    assert config_error([], world_size=2) == (
        "TORCHTITAN_FAULT: 'freeze@step:rank=1': use stop@<point> or sleep=<seconds>@<point>, point one of data,"
        " step, checkpoint_write; unset it outside the failure tests"
    )


def test_good_fault_variable_accepted(monkeypatch):
    monkeypatch.setenv(
        "TORCHTITAN_FAULT", "stop@data:rank=1:step=4; sleep=30@checkpoint_write:step=6"
    )
    load_config([], 2)
