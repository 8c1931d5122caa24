"""Preemption on real 4-rank runs through run_train.sh and torchrun: SIGTERM to the launcher
(what Slurm sends) and to one worker alone; the step in progress is checkpointed, the run exits
75, and the same command resumes with the losses of a run never interrupted, bitwise."""

import signal

import checkpoint_checks as cc
import pytest
import resilience_checks as rc


def _check_preempted(p: dict, dump: str, who: str) -> int:
    assert p["rc"] == 75, p["output"][-3000:]
    step = p["step"]
    assert step is not None and 6 <= step < rc.STEPS, p["output"][-3000:]
    (line,) = [ln for ln in p["lines"] if "preempted:" in ln]
    assert line.startswith(
        f"[torchtitan] preempted: SIGTERM reached {who}; stopped after step {step}, checkpoint"
        f" {dump}/checkpoint/step-{step} saved in "
    ), line
    assert line.endswith("exit 75: rerun the same command to resume"), line
    marker = rc.marker(dump, step)  # the step in progress, complete (off the interval but the 5th)
    assert marker["step"] == step and marker["model_only"] is False
    assert sorted(p["losses"]) == list(range(1, step + 1))
    return step


@pytest.mark.parametrize("target", ["launcher", "worker"])
def test_sigterm_checkpoints_the_step_and_the_resumed_run_matches_bitwise(
    target, fsdp_run, tmp_path
):
    dump = str(tmp_path / target)
    # the launcher's run also saves asynchronously: its step-5 save is in flight or done when
    # the preemption's synchronous save waits for it
    extra = ["--checkpoint.async_mode=async"] if target == "launcher" else []
    p = rc.preempt_run(dump, target, signal.SIGTERM, rank=2, extra=extra)
    step = _check_preempted(p, dump, "ranks 0-3" if target == "launcher" else "rank 2")
    assert p["exit_s"] < 30, p["exit_s"]  # within Slurm's default KillWait
    resumed, log = rc.resume(dump, extra)
    assert f"checkpoint: resumed from step {step} ({dump}/checkpoint/step-{step})" in log
    assert resumed == cc.straight_losses(
        fsdp_run
    )  # steps 1..step preempted, the rest resumed: bitwise
