"""Hang reports on real 4-rank runs: a rank frozen (SIGSTOP) in its data read or inside the
step, or alive but stuck, is named in one line, with where the others wait, long before the
collective timeout; every rank that can writes its stacks to <dump>/hang/."""

import pytest
import resilience_checks as rc

WAIT = "wait in step 4: forward/backward at torch/distributed/"


@pytest.mark.parametrize("frozen,point", [(2, "data"), (0, "step")])
def test_a_frozen_rank_is_named_by_the_others(frozen, point, tmp_path):
    h = rc.hang_run(str(tmp_path / "hang"), f"stop@{point}:rank={frozen}:step=4")
    assert h["rc"] == 1, h["output"][-3000:]
    (line,) = h["lines"]  # rank 0's console, or (rank 0 frozen) the launcher's from the status file
    others = "1-3" if frozen == 0 else "0-1,3"
    where = "step 4: data" if point == "data" else "step 4: forward/backward"
    assert line.startswith(
        f"error: hang: rank {frozen} stopped making progress and went silent (no heartbeat for"
    ), line
    assert f"last seen in {where}); ranks {others} {WAIT}" in line, line
    assert line.endswith(f"stacks in {tmp_path}/hang/hang/"), line
    assert h["files"] == sorted(
        ["report.txt"] + [f"rank{r}.txt" for r in range(4) if r != frozen]
    ), h["files"]
    reporter = (
        1 if frozen == 0 else 0
    )  # the lowest live rank: not rank 0 when rank 0 is the frozen one
    assert f"reported by rank {reporter}, hang_timeout_seconds=3" in h["report"]
    assert h["seconds"] < 45, h[
        "seconds"
    ]  # start-up, 4 steps, 3 s + the report, 5 s grace: not the 60 s timeout
