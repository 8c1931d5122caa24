"""The hang watchdog's pure helpers (interval, where a stack waits, short paths), its limit
and its heartbeats. (The launcher finding its workers in /proc, with a child process of its
own: tests/integration/test_launcher_finds_workers.py.)"""

import traceback

import pytest

from torchtitan.resilience.hang_watchdog import _short, where_waiting
from torchtitan.resilience.timeouts import heartbeat_interval, longest_hang_timeout


@pytest.mark.parametrize(
    "timeout, interval",
    [(0, 0.5), (3, 0.5), (5, 0.5), (30, 3.0), (99, 9.9), (100, 10.0), (180, 10.0), (3600, 10.0)],
)
def test_heartbeat_interval(timeout, interval):
    assert heartbeat_interval(timeout) == interval


@pytest.mark.parametrize(
    "timeout, longest", [(300, 238), (100, 61), (20, 11), (6, 1), (5, 0), (1, 0)]
)
def test_longest_hang_timeout_leaves_six_intervals_for_the_report(timeout, longest):
    assert longest_hang_timeout(timeout) == longest
    if longest:
        assert longest + 6 * heartbeat_interval(longest) + 1 < timeout
    assert longest + 1 + 6 * heartbeat_interval(longest + 1) + 1 >= timeout


@pytest.mark.parametrize(
    "filename, short",
    [
        ("/work/main/torchtitan/train.py", "torchtitan/train.py"),
        (
            "/home/u/.venv/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py",
            "torch/distributed/distributed_c10d.py",
        ),
        (
            "/home/u/.venv/lib/python3.12/site-packages/numpy/core/fromnumeric.py",
            "numpy/core/fromnumeric.py",
        ),
        (
            "/home/u/.venv/lib/python3.12/site-packages/torchtitan/train.py",
            "torchtitan/train.py",
        ),  # installed, not editable
        ("/usr/lib/python3.12/threading.py", "threading.py"),
    ],
)
def test_short(filename, short):
    assert _short(filename) == short


def test_short_torch_inside_a_checkout_named_torchtitan():
    assert (
        _short("/src/torchtitan/.venv/lib/python3.12/site-packages/torch/distributed/x.py")
        == "torch/distributed/x.py"
    )
    frames = [
        frame("/h/torchtitan/torchtitan/train.py", 5, "step"),
        frame(
            "/h/torchtitan/.venv/lib/python3.12/site-packages/torch/distributed/x.py",
            12,
            "all_gather",
        ),
    ]
    assert (
        where_waiting(frames)
        == "torch/distributed/x.py:12 all_gather (from torchtitan/train.py:5 step)"
    )


def frame(filename, lineno, name):
    return traceback.FrameSummary(filename, lineno, name, line="")


OURS = frame("/work/main/torchtitan/train.py", 5, "step")
TORCH = frame("/v/lib/python3.12/site-packages/torch/distributed/x.py", 12, "all_gather")


def test_where_waiting_in_torch_from_torchtitan():
    frames = [
        frame("/work/main/torchtitan/launcher.py", 1, "main"),
        OURS,
        frame("/v/lib/python3.12/site-packages/torch/nn/module.py", 3, "__call__"),
        TORCH,
    ]
    assert (
        where_waiting(frames)
        == "torch/distributed/x.py:12 all_gather (from torchtitan/train.py:5 step)"
    )


def test_where_waiting_innermost_is_ours():
    assert (
        where_waiting([frame("/usr/lib/python3.12/runpy.py", 9, "run"), OURS])
        == "torchtitan/train.py:5 step"
    )


def test_where_waiting_without_torchtitan_frames():
    assert (
        where_waiting([frame("/usr/lib/python3.12/runpy.py", 9, "run"), TORCH])
        == "torch/distributed/x.py:12 all_gather"
    )


def test_where_waiting_empty():
    assert where_waiting([]) == ""


def test_the_hang_limit_follows_long_steps_their_pauses_left_out(tmp_path, monkeypatch):
    import torch

    from torchtitan.observe.step_clock import StepClock
    from torchtitan.resilience import hang_watchdog

    now = [100.0]
    monkeypatch.setattr(hang_watchdog.time, "monotonic", lambda: now[0])
    w = hang_watchdog.HangWatchdog(10, str(tmp_path), rank=0, world=1, device=torch.device("cpu"))

    clock = StepClock(w.paused_seconds)

    def step(seconds, compiling=0.0, synced=True):
        clock.begin()
        if compiling:
            w._pause()  # what torch.compile's start / end callbacks call
            now[0] += compiling
            w._resume()
        now[0] += seconds
        if clock.end(synced) is not None:
            w.step_time(clock.longest_step_s)

    step(4.0, compiling=300.0)  # the first step: compilation paused, 4 s of it count
    assert w.limit == 10
    step(12.0)
    assert w.limit == 18.0
    with w.paused("validation after step 2"):  # between steps: not a step's time
        now[0] += 50
    step(3.0)
    assert w.limit == 18.0
    # steps between sync points: their time is known at the sync, as the window's mean
    step(30.0, synced=False)
    assert w.limit == 18.0
    step(2.0)
    assert w.limit == 24.0 and clock.last_step_s == 16.0


def test_the_watchdog_beats_into_the_store_and_closes_at_once(tmp_path, monkeypatch):
    import json
    import time

    import torch
    from torch.distributed import PrefixStore, TCPStore

    from torchtitan.resilience.hang_watchdog import HangWatchdog

    master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(master.port))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "unit")
    w = HangWatchdog(100, str(tmp_path), rank=3, world=4, device=torch.device("cpu"))
    w.start()
    w.progress("step 1: data")
    store = PrefixStore("torchtitan_hang/unit/0/", master)
    deadline = time.time() + 10
    while time.time() < deadline and not (
        store.check(["hb/3"]) and json.loads(store.get("hb/3"))["seq"] == 1
    ):
        time.sleep(0.02)
    beat = json.loads(store.get("hb/3"))
    assert (beat["seq"], beat["activity"], beat["paused"]) == (1, "step 1: data", False)
    start = time.monotonic()
    w.close()  # its thread waits in 10 s heartbeat intervals: closing must not wait for one
    assert time.monotonic() - start < 1.0
    assert not w._thread.is_alive()
