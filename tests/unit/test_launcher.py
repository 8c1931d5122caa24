"""The launcher finds its workers in /proc; the hang watchdog's pure helpers (interval, where a stack waits, short paths)."""

import os
import subprocess
import traceback

import pytest

from torchtitan.components.hang_watchdog import _short, interval_for, where_waiting
from torchtitan.launcher import workers


def test_workers_lists_a_child_and_not_itself():
    child = subprocess.Popen(["sleep", "5"])
    try:
        found = workers(os.getpid())
        assert child.pid in found
        assert os.getpid() not in found
    finally:
        child.kill()
        child.wait()
    assert child.pid not in workers(os.getpid())  # reaped: gone from /proc


@pytest.mark.parametrize("timeout, interval", [(0, 0.5), (3, 0.5), (5, 0.5), (30, 3.0), (99, 9.9), (100, 10.0),
                                               (180, 10.0), (3600, 10.0)])
def test_interval_for(timeout, interval):
    assert interval_for(timeout) == interval


@pytest.mark.parametrize("filename, short", [
    ("/work/main/torchtitan/train.py", "torchtitan/train.py"),
    ("/home/u/.venv/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py",
     "torch/distributed/distributed_c10d.py"),
    ("/home/u/.venv/lib/python3.12/site-packages/numpy/core/fromnumeric.py", "numpy/core/fromnumeric.py"),
    ("/home/u/.venv/lib/python3.12/site-packages/torchtitan/train.py", "torchtitan/train.py"),  # installed, not editable
    ("/usr/lib/python3.12/threading.py", "threading.py"),
])
def test_short(filename, short):
    assert _short(filename) == short


def test_short_torch_inside_a_checkout_named_torchtitan():
    assert _short("/src/torchtitan/.venv/lib/python3.12/site-packages/torch/distributed/x.py") == \
        "torch/distributed/x.py"
    frames = [frame("/h/torchtitan/torchtitan/train.py", 5, "step"),
              frame("/h/torchtitan/.venv/lib/python3.12/site-packages/torch/distributed/x.py", 12, "all_gather")]
    assert where_waiting(frames) == "torch/distributed/x.py:12 all_gather (from torchtitan/train.py:5 step)"


def frame(filename, lineno, name):
    return traceback.FrameSummary(filename, lineno, name, line="")


OURS = frame("/work/main/torchtitan/train.py", 5, "step")
TORCH = frame("/v/lib/python3.12/site-packages/torch/distributed/x.py", 12, "all_gather")


def test_where_waiting_in_torch_from_torchtitan():
    frames = [frame("/work/main/torchtitan/launcher.py", 1, "main"), OURS,
              frame("/v/lib/python3.12/site-packages/torch/nn/module.py", 3, "__call__"), TORCH]
    assert where_waiting(frames) == "torch/distributed/x.py:12 all_gather (from torchtitan/train.py:5 step)"


def test_where_waiting_innermost_is_ours():
    assert where_waiting([frame("/usr/lib/python3.12/runpy.py", 9, "run"), OURS]) == "torchtitan/train.py:5 step"


def test_where_waiting_without_torchtitan_frames():
    assert where_waiting([frame("/usr/lib/python3.12/runpy.py", 9, "run"), TORCH]) == "torch/distributed/x.py:12 all_gather"


def test_where_waiting_empty():
    assert where_waiting([]) == ""
