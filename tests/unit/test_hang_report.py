"""Hang reports: rank ranges, which ranks are named and why, and the exact report line and table."""

import os

import pytest

from torchtitan.resilience.hang_report import RankState, culprits, ranks_text, summary, table

WAIT = "torch/distributed/distributed_c10d.py:2501 all_reduce (from torchtitan/train.py:310 train_step)"
TAIL = f"; stacks in /run/hang{os.sep}"


def alive(rank, seq=10, activity="step 4: forward/backward", where=WAIT, **kw):
    return RankState(rank, True, seq, activity, 40.0, where, **kw)


def silent(rank, seq=9, activity="step 4: data", silent_s=52.4):
    return RankState(rank, False, seq, activity, 55.0, silent_s=silent_s)


@pytest.mark.parametrize(
    "ranks, text",
    [
        ([0, 1, 2, 5, 7, 8], "0-2,5,7-8"),
        ([8, 7, 0, 2, 1, 5], "0-2,5,7-8"),
        ([3], "3"),
        ([], ""),
        ([0, 2], "0,2"),
    ],
)
def test_ranks_text(ranks, text):
    assert ranks_text(ranks) == text


def test_culprits():
    assert culprits([alive(0), silent(1), alive(2, seq=3), silent(3)]) == ([1, 3], "silent")
    assert culprits([alive(0, seq=7), alive(1, seq=6), alive(2, seq=7), alive(3, seq=6)]) == (
        [1, 3],
        "behind",
    )
    assert culprits([alive(0, seq=7)]) == ([0], "behind")
    assert culprits([alive(0), alive(1), alive(2)]) == ([], "")


def test_summary_one_silent_rank():
    line = summary([alive(0), silent(1), alive(2), alive(3)], 30, "/run/hang")
    assert line == (
        "hang: rank 1 stopped making progress and went silent (no heartbeat for 52s; last seen in"
        f" step 4: data); ranks 0,2-3 wait in step 4: forward/backward at {WAIT}" + TAIL
    )


def test_summary_silent_rank_0():
    line = summary([silent(0, silent_s=61.6), alive(1), alive(2), alive(3)], 30, "/run/hang")
    assert line == (
        "hang: rank 0 stopped making progress and went silent (no heartbeat for 62s; last seen in"
        f" step 4: data); ranks 1-3 wait in step 4: forward/backward at {WAIT}" + TAIL
    )


def test_summary_alive_rank_behind_in_data():
    states = [
        alive(0),
        alive(1, seq=9, activity="step 4: data", where="torchtitan/data/dataloader.py:88 next"),
        alive(2),
    ]
    assert summary(states, 30, "/run/hang") == (
        "hang: rank 1 stopped making progress in step 4: data at torchtitan/data/dataloader.py:88 next;"
        f" ranks 0,2 wait in step 4: forward/backward at {WAIT}" + TAIL
    )


def test_summary_no_rank_behind():
    assert summary([alive(r, where="") for r in range(4)], 30.4, "/run/hang") == (
        "hang: no rank is behind: all 4 wait at the same point for over 30s (a collective the ranks disagree on,"
        " or one that never completes); ranks 0-3 wait in step 4: forward/backward" + TAIL
    )


def test_summary_lists_waiting_groups_in_rank_order():
    states = [
        alive(0, 12, "step 4: optimizer", "a.py:1 f"),
        alive(1, 8, "step 4: data", ""),
        alive(2, 12, "step 4: loss", "b.py:2 g"),
        alive(3, 12, "step 4: optimizer", "a.py:1 f"),
        alive(4, 12, "step 4: loss", "b.py:2 g"),
    ]
    assert summary(states, 30, "/run/hang") == (
        "hang: rank 1 stopped making progress in step 4: data; ranks 0,3 wait in step 4: optimizer at a.py:1 f;"
        " ranks 2,4 wait in step 4: loss at b.py:2 g" + TAIL
    )


def test_summary_groups_by_lowest_rank_whatever_the_order_given():
    states = [
        alive(3, 12, "step 4: loss", "a.py:1 f"),
        alive(0, 12, "step 4: loss", "a.py:1 f"),
        alive(2, 12, "step 4: optimizer", "b.py:2 g"),
        alive(1, 8, "step 4: data", ""),
    ]
    assert summary(states, 30, "/run/hang") == (
        "hang: rank 1 stopped making progress in step 4: data; ranks 0,3 wait in step 4: loss at a.py:1 f;"
        " rank 2 waits in step 4: optimizer at b.py:2 g" + TAIL
    )


def test_table_one_sorted_row_per_rank():
    states = [
        alive(2, where="a.py:3 w", host="averyverylonghostname"),
        silent(0),
        alive(1, where="", host="h1"),
    ]
    assert table(states).split("\n") == [
        " rank  state    host          progress  quiet s  activity / where",
        "    0  SILENT                        9     55.0  step 4: data",
        "    1  alive    h1                  10     40.0  step 4: forward/backward",
        "    2  alive    averyverylon        10     40.0  step 4: forward/backward | a.py:3 w",
    ]
