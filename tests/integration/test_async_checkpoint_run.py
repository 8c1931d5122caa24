"""Asynchronous checkpoints on real runs: training goes on while a save is written; a rank
killed during that write leaves only step-N.tmp (never loaded), and the run resumes from the
previous asynchronous checkpoint with bitwise the losses it had."""

import os

import checkpoint_checks as cc
import resilience_checks as rc


def test_kill_during_an_async_write_leaves_nothing_that_loads_and_resume_is_bitwise(tmp_path):
    dump = str(tmp_path / "async")
    k = rc.async_kill_run(dump)  # step 6's write takes 30 s more; rank 1 killed after step 8
    assert k["returncode"] != 0 and k["all_gone"], k["output"][-3000:]
    assert "[torchtitan] checkpoint step-6: staged in" in k["output"]
    assert sorted(k["losses"]) == list(
        range(1, 9)
    )  # steps 7 and 8 trained while step 6 was written
    assert k["complete"] == ["step-3"] and "step-6.tmp" in k["checkpoints"], k["checkpoints"]
    assert not os.path.exists(os.path.join(dump, "checkpoint", "step-6.tmp", ".complete"))
    resumed, log = cc.resume_after_kill(dump, steps=12, ngpu=2, extra=rc.ASYNC)
    assert f"checkpoint: resumed from step 3 ({dump}/checkpoint/step-3)" in log
    assert [resumed[s] for s in range(4, 9)] == [k["losses"][s] for s in range(4, 9)]
    assert sorted(os.listdir(os.path.join(dump, "checkpoint"))) == [
        "step-12",
        "step-3",
        "step-6",
        "step-9",
    ]
