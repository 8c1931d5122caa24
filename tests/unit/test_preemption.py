"""Preemption: who was signalled, the closing line, the handlers around the loop, and the world agreement."""

import signal
import time

import pytest
import torch

from torchtitan.resilience.preemption import Preemption, Stop, stop_line

TAIL = (
    " (Slurm sends SIGKILL 30s after SIGTERM unless KillWait says otherwise);"
    " exit 75: rerun the same command to resume"
)


def test_who():
    assert Stop({3: "SIGTERM"}, 1.0).who() == "SIGTERM reached rank 3"
    assert (
        Stop({0: "SIGTERM", 1: "SIGTERM", 2: "SIGTERM", 5: "SIGTERM"}, 1.0).who()
        == "SIGTERM reached ranks 0-2,5"
    )
    assert Stop({4: "SIGUSR1", 1: "SIGTERM"}, 1.0).who() == "SIGTERM/SIGUSR1 reached ranks 1,4"


def test_stop_line_with_a_checkpoint():
    line = stop_line(Stop({0: "SIGUSR1", 1: "SIGUSR1"}, 2.0), 12, "step-12", 3.456, 7.04)
    assert line == (
        "preempted: SIGUSR1 reached ranks 0-1; stopped after step 12, checkpoint step-12 saved in 3.46s,"
        " 7.0s after the signal" + TAIL
    )


def test_stop_line_without_checkpointing():
    line = stop_line(Stop({1: "SIGTERM"}, 0.5), 3, None, 0.0, 0.96)
    assert line == (
        "preempted: SIGTERM reached rank 1; stopped after step 3, nothing saved (checkpointing is off:"
        " --checkpoint.enable=false), 1.0s after the signal" + TAIL
    )


@pytest.fixture
def outer_handlers():
    """A harmless recording handler for SIGTERM and SIGUSR1 around the test (the originals restored after)."""
    seen = []
    saved = {
        s: signal.signal(s, lambda signum, frame: seen.append(signum))
        for s in (signal.SIGTERM, signal.SIGUSR1)
    }
    yield seen, {s: signal.getsignal(s) for s in saved}
    for s, handler in saved.items():
        signal.signal(s, handler)


def test_handlers_installed_inside_and_restored_after(outer_handlers):
    seen, outer = outer_handlers
    p = Preemption(torch.device("cpu"))
    with p:
        for s in (signal.SIGTERM, signal.SIGUSR1):
            assert signal.getsignal(s) == p._on_signal
    for s in (signal.SIGTERM, signal.SIGUSR1):
        assert signal.getsignal(s) is outer[s]
    signal.raise_signal(signal.SIGUSR1)  # outside: the outer handler gets it, not the flag
    assert seen == [signal.SIGUSR1]
    assert (p.signum, p.received_at) == (0, None)


def test_first_signal_counts(outer_handlers):
    seen, _ = outer_handlers
    p = Preemption(torch.device("cpu"))
    with p:
        before = time.monotonic()
        signal.raise_signal(signal.SIGUSR1)
        assert p.signum == signal.SIGUSR1
        assert before <= p.received_at <= time.monotonic()
        first_at = p.received_at
        signal.raise_signal(signal.SIGTERM)
        assert (p.signum, p.received_at) == (signal.SIGUSR1, first_at)
    assert seen == []


def test_agree_on_one_gloo_rank_one_boundary_after_the_signal(gloo_world):
    p = Preemption(torch.device("cpu"))
    assert p.agree() is None  # boundary 1: starts its all-reduce (no signal)
    p.signum, p.received_at = signal.SIGTERM, time.monotonic() - 2.0
    assert p.agree() is None  # boundary 2: reads boundary 1's (no signal then), starts its own
    stop = p.agree()  # boundary 3: reads boundary 2's
    assert stop.signals == {0: "SIGTERM"}
    assert 2.0 <= stop.since_signal_s < 30.0
    assert stop.who() == "SIGTERM reached rank 0"
    assert p._pending is None  # stopping starts nothing more
    p.drain()


def test_drain_completes_the_all_reduce_in_flight(gloo_world):
    p = Preemption(torch.device("cpu"))
    assert p.agree() is None
    assert p._pending is not None
    p.drain()
    assert p._pending is None


def test_kill_wait_note_only_when_a_preemption_would_not_fit():
    from torchtitan.resilience.preemption import kill_wait_note

    assert kill_wait_note(save_s=20.0, step_s=8.0) is None  # 29 s with the exit: fits in 30 s
    assert kill_wait_note(save_s=25.0, step_s=10.0) == (
        "a preemption needs about 36s (a step 10.0s + a save 25.0s + exit) but Slurm sends SIGKILL 30s after SIGTERM"
        " by default: ask for more (partition GraceTime, KillWait) or signal earlier before the time limit"
        " (sbatch --signal=USR1@<seconds>)"
    )
