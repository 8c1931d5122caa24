"""What a step leaves on the device and when the host reads it: the non-finite flag
(training/nonfinite.py) and the step clock (observe/step_clock.py)."""

import math

import pytest
import torch

from torchtitan.observe import step_clock
from torchtitan.observe.step_clock import StepClock
from torchtitan.training.nonfinite import NonFiniteLossError, NonFiniteWatch


def test_the_first_nonfinite_figure_is_kept_with_its_step_and_value():
    watch = NonFiniteWatch(torch.device("cpu"))
    watch.record(1, torch.tensor(2.5), torch.tensor(0.3))
    assert watch.first_step() is None
    watch.record(2, torch.tensor(3.0), torch.tensor(float("nan")))
    watch.record(3, torch.tensor(float("inf")), torch.tensor(float("nan")))  # later: not the first
    assert watch.first_step()[:2] == (2, "gradient norm") and math.isnan(watch.first_step()[2])
    with pytest.raises(
        NonFiniteLossError, match=r"^gradient norm is nan at step 2: training stopped"
    ):
        watch.check()


def test_the_loss_is_named_before_the_gradient_norm_of_the_same_step():
    watch = NonFiniteWatch(torch.device("cpu"))
    watch.record(7, torch.tensor(float("inf")), torch.tensor(float("nan")))
    assert watch.first_step() == (7, "loss", math.inf)


def test_recording_reads_nothing_on_the_host():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Reads(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Reads.n += func is torch.ops.aten._local_scalar_dense.default
            return func(*args, **(kwargs or {}))

    watch = NonFiniteWatch(torch.device("cpu"))
    with Reads():
        for step in range(1, 4):
            watch.record(step, torch.tensor(1.0), torch.tensor(float("nan") if step == 2 else 1.0))
    assert Reads.n == 0
    assert watch.first_step()[:2] == (2, "gradient norm")


def test_step_time_is_the_mean_over_the_window_ending_at_a_sync(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(step_clock.time, "monotonic", lambda: now[0])
    paused = [0.0]
    clock = StepClock(lambda: paused[0])

    def step(seconds, synced, compiling=0.0):
        clock.begin()
        now[0] += seconds + compiling
        paused[0] += compiling
        return clock.end(synced)

    assert step(1.0, False, compiling=9.0) is None  # queued: nothing known yet
    assert step(0.5, False) is None
    assert step(4.5, True) == pytest.approx(5.0)  # (10 + 0.5 + 4.5) / 3
    assert clock.longest_step_s == pytest.approx(2.0)  # compilation left out: (1 + 0.5 + 4.5) / 3
    assert step(3.0, True) == pytest.approx(3.0) and clock.longest_step_s == pytest.approx(3.0)
    assert clock.last_step_s == pytest.approx(3.0)


def test_nothing_in_the_package_waits_for_the_whole_device():
    """No `torch.cuda.synchronize()` / `torch.accelerator.synchronize()` / `Stream.synchronize`
    anywhere in torchtitan/ (the loop and all it calls): a sync point is a read of a figure,
    never a device-wide wait. The one event wait allowed: the preemption agreement's, on the
    event recorded one step boundary earlier (resilience/preemption.py)."""
    import ast
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2] / "torchtitan"
    waits = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "synchronize"
            ):
                waits.append(str(path.relative_to(root.parent)))
    assert waits == ["torchtitan/resilience/preemption.py"], waits
