"""TORCHTITAN_FAULT: parse() turns a spec into exact Fault records or names the bad part; point() fires only where asked."""

import os
import signal

import pytest

from torchtitan.resilience import faults
from torchtitan.resilience.faults import Fault, parse

USAGE = "use stop@<point> or sleep=<seconds>@<point>, point one of data, step, checkpoint_write"
CONDS = "conditions are rank=<r> and step=<n>"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("", []),
        ("stop@data", [Fault("stop", 0.0, "data", None, None)]),
        ("stop@data:rank=2:step=4", [Fault("stop", 0.0, "data", 2, 4)]),
        ("stop@step:step=5:rank=0", [Fault("stop", 0.0, "step", 0, 5)]),
        ("sleep=600@data:rank=1", [Fault("sleep", 600.0, "data", 1, None)]),
        ("sleep=2.5@checkpoint_write:step=6", [Fault("sleep", 2.5, "checkpoint_write", None, 6)]),
        (
            "  stop@data:rank=3 ; sleep=1@step:step=2;  ;",
            [Fault("stop", 0.0, "data", 3, None), Fault("sleep", 1.0, "step", None, 2)],
        ),
    ],
)
def test_parse_valid(text, expected):
    assert parse(text) == expected


@pytest.mark.parametrize(
    "text, part, why",
    [
        ("kill@data", "kill@data", USAGE),  # unknown action
        ("stop@nowhere", "stop@nowhere", USAGE),  # unknown point
        ("stop", "stop", USAGE),  # no point at all
        ("stop=3@data", "stop=3@data", USAGE),  # stop takes no seconds
        ("sleep@data", "sleep@data", USAGE),  # sleep needs them
        ("stop @data", "stop @data", USAGE),  # no blanks inside a part
        ("stop@data;sleep@step", "sleep@step", USAGE),  # the second part is the bad one
        ("stop@data:host=a", "stop@data:host=a", CONDS),
        ("stop@data:rank", "stop@data:rank", CONDS),
        ("stop@data:rank=1:rank=2", "stop@data:rank=1:rank=2", CONDS),
        ("stop@data:", "stop@data:", CONDS),
    ],
)
def test_parse_invalid_names_the_part(text, part, why):
    with pytest.raises(ValueError) as info:
        parse(text)
    assert str(info.value) == f"TORCHTITAN_FAULT: '{part}': {why}"


@pytest.mark.parametrize(
    "text",
    ["sleep=abc@data", "stop@data:rank=x", "stop@data:step=4.5", "sleep=-5@data", "sleep=inf@data"],
)
def test_parse_non_numbers_name_the_part(text):
    with pytest.raises(ValueError) as info:
        parse(text)
    assert (
        str(info.value)
        == f"TORCHTITAN_FAULT: '{text}': seconds are a number, rank and step integers"
    )


@pytest.fixture
def fired(monkeypatch):
    """What point() did: ('sleep', s) and ('kill', pid, sig) in order; nothing really sleeps or stops."""
    calls = []
    monkeypatch.setattr(faults.time, "sleep", lambda s: calls.append(("sleep", s)))
    monkeypatch.setattr(faults.os, "kill", lambda pid, sig: calls.append(("kill", pid, sig)))
    monkeypatch.delenv(faults.ENV, raising=False)
    monkeypatch.delenv("RANK", raising=False)
    return calls


def test_point_sleeps_on_the_matching_rank_and_step(fired, monkeypatch, capsys):
    monkeypatch.setenv(faults.ENV, "sleep=7.5@data:rank=1:step=3")
    monkeypatch.setenv("RANK", "1")
    faults.point("data", step=3)
    assert fired == [("sleep", 7.5)]
    assert (
        capsys.readouterr().out
        == "[torchtitan] fault injected (TORCHTITAN_FAULT): sleep at data, step 3, rank 1\n"
    )


@pytest.mark.parametrize(
    "name, step, rank", [("data", 3, "0"), ("data", 4, "1"), ("step", 3, "1"), ("data", None, "1")]
)
def test_point_elsewhere_does_nothing(fired, monkeypatch, capsys, name, step, rank):
    monkeypatch.setenv(faults.ENV, "sleep=7.5@data:rank=1:step=3")
    monkeypatch.setenv("RANK", rank)
    faults.point(name, step=step)
    assert fired == []
    assert capsys.readouterr().out == ""


def test_point_without_the_variable_does_nothing(fired, capsys):
    faults.point("data", step=1)
    assert fired == []
    assert capsys.readouterr().out == ""


def test_point_without_conditions_fires_on_rank_0_every_step(fired, monkeypatch):
    monkeypatch.setenv(faults.ENV, "sleep=2@step")
    faults.point("step", step=1)
    faults.point("step", step=9)
    assert fired == [("sleep", 2.0), ("sleep", 2.0)]


def test_stop_sends_sigstop_to_its_own_pid(fired, monkeypatch):
    monkeypatch.setenv(faults.ENV, "sleep=1@data;stop@step:rank=2:step=4")
    monkeypatch.setenv("RANK", "2")
    faults.point("step", step=4)
    assert fired == [("sleep", 0.2), ("kill", os.getpid(), signal.SIGSTOP)]
