"""The launcher's status file: written only when asked, one line whole, read back or None; the preempted exit code."""

import os

import pytest

from torchtitan.resilience import exit_status
from torchtitan.resilience.exit_status import preempted_exit_code, read, record


def test_record_without_the_variable_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHTITAN_STATUS_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    record(1, "hang: rank 1 stopped")
    monkeypatch.setenv("TORCHTITAN_STATUS_FILE", "")  # empty counts as unset
    record(1, "hang: rank 1 stopped")
    assert os.listdir(tmp_path) == []


def test_record_writes_code_local_rank_and_one_line(tmp_path, monkeypatch):
    path = tmp_path / "status"
    monkeypatch.setenv("TORCHTITAN_STATUS_FILE", str(path))
    monkeypatch.setenv("LOCAL_RANK", "3")
    record(75, "preempted: SIGTERM\nreached rank 3;\r\n  rerun  ")
    assert path.read_text() == "75 3\npreempted: SIGTERM reached rank 3; rerun\n"
    assert os.listdir(tmp_path) == ["status"]  # no temporary file left behind
    assert read(str(path)) == (75, 3, "preempted: SIGTERM reached rank 3; rerun")


def test_record_replaces_the_previous_one_and_defaults_to_local_rank_0(tmp_path, monkeypatch):
    path = tmp_path / "status"
    monkeypatch.setenv("TORCHTITAN_STATUS_FILE", str(path))
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    record(2, "first")
    record(1, "second")
    assert path.read_text() == "1 0\nsecond\n"


@pytest.mark.parametrize(
    "text", ["", "\n", "abc\nline\n", "75\nline\n", "1 2 3\nline\n", "x 0\nline\n"]
)
def test_read_garbled_is_none(tmp_path, text):
    (tmp_path / "status").write_text(text)
    assert read(str(tmp_path / "status")) is None


def test_read_missing_is_none(tmp_path):
    assert read(str(tmp_path / "absent")) is None


def test_read_a_code_without_a_line(tmp_path):
    (tmp_path / "status").write_text("1 5\n")
    assert read(str(tmp_path / "status")) == (1, 5, "")


def test_preempted_exit_code(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHTITAN_STATUS_FILE", str(tmp_path / "status"))
    assert preempted_exit_code() == exit_status.EXIT_OK == 0
    monkeypatch.delenv("TORCHTITAN_STATUS_FILE")
    assert preempted_exit_code() == exit_status.EXIT_PREEMPTED == 75
