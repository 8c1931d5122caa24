"""torchft replica groups on real runs (scripts/ft_local.py: a lighthouse and 2 groups of 2 CPU
ranks, each a run_train.sh job): with both groups alive the job trains as HSDP 2 x 2 (the same
gradient norms, bitwise); every rank of group 1 killed with SIGKILL, group 0 trains on alone
without a long stall and completes every step, and group 1 restarted heals from group 0: its
weights bitwise group 0's (the digests both sides log), then both train in step; the whole
job resumed from the checkpoint written under fault tolerance repeats its last steps bitwise."""

import os
import shutil

import ft_runs
import pytest
import run_tests

STEPS = 70
RESUME_AT = 60  # the checkpoint the whole job resumes from (group 1 healed long before)
KILL_AT, RESTART_AT = 6, 10
INTERVAL = 20  # checkpoint steps (written by group 0, the lowest group in every quorum)
TINY = [*ft_runs.TINY, "--training.gc_freq=1000"]


def _rows(path: str) -> dict[int, dict]:
    return ft_runs.rows(path)


def _ft_local(dump, *script_args: str, slow: bool = True) -> tuple[dict, str]:
    # slow: ~0.1 s more per step on every rank, so that group 0 is still training when the
    # restarted group 1 has started (~10 s)
    job = [
        f"--training.steps={STEPS}",
        "--checkpoint.enable=true",
        f"--checkpoint.interval={INTERVAL}",
        *TINY,
    ]
    env = {"TORCHTITAN_FAULT": "sleep=0.1@data"} if slow else None
    return ft_runs.ft_local(dump, *script_args, "--", *job, ranks=2, env=env, timeout=500)


@pytest.fixture(scope="module")
def killed_and_healed(tmp_path_factory):
    dump = tmp_path_factory.mktemp("ft")
    summary, out = _ft_local(dump, f"--kill=1@{KILL_AT}", f"--restart-at={RESTART_AT}")
    return summary, str(dump), out


def test_two_replica_groups_train_as_hsdp(killed_and_healed, tmp_path):
    """Steps 1..KILL_AT (both groups alive) against HSDP 2 x 2 in one job: the gradients are
    averaged over the same 4 ranks' batches, so the norms are bitwise equal; the logged loss is
    reduced in another order (groups, then ranks), within one float32 ulp."""
    _, dump, _ = killed_and_healed
    rc, _, out = run_tests.launch(
        4,
        [
            *TINY,
            f"--training.steps={KILL_AT}",
            "--parallelism.data_parallel_replicate_degree=2",
            "--parallelism.data_parallel_shard_degree=2",
            f"--job.dump_folder={tmp_path}",
        ],
        str(tmp_path / "ranks"),
    )
    assert rc == 0, out[-3000:]
    hsdp = _rows(str(tmp_path / "metrics.jsonl"))
    ft = _rows(os.path.join(dump, "group_0", "metrics.jsonl"))
    for step in range(1, KILL_AT + 1):
        assert ft[step]["grad_norm"] == hsdp[step]["grad_norm"], step
        assert ft[step]["loss"] == pytest.approx(hsdp[step]["loss"], rel=2e-7, abs=0), step
        assert ft[step]["replica_groups"] == 2


def test_a_killed_group_does_not_stop_the_other_and_heals_bitwise_on_restart(killed_and_healed):
    summary, dump, out = killed_and_healed
    assert summary["exit_codes"] == [0, 0], out[-5000:]  # group 1: its restarted run
    assert summary["group0_steps"] == STEPS  # the survivor completed every step
    # no step of the survivor much longer than its neighbours (the lost group costs torchft's
    # heartbeat timeout and one collective's timeout at most)
    gaps = {int(s): t for s, t in summary["group0_step_seconds"].items()}
    typical = sorted(gaps.values())[len(gaps) // 2]
    assert max(gaps.values()) < typical + 10, gaps
    # group 1's restart: its first step within 30 s, its weights bitwise group 0's
    assert summary["restart_to_first_step_s"] <= 30, summary
    healed_step, digest = summary["healed"]
    assert summary["sent"] == [[healed_step, digest]], summary
    healed_step = int(healed_step)
    assert RESTART_AT <= healed_step < RESUME_AT
    g0 = _rows(os.path.join(dump, "group_0", "metrics.jsonl"))
    g1 = _rows(os.path.join(dump, "group_1", "metrics.jsonl"))
    # group 0 alone while group 1 was down, both after the heal
    alone = [s for s in range(KILL_AT + 2, healed_step) if g0[s]["replica_groups"] == 1]
    assert alone, [g0[s]["replica_groups"] for s in sorted(g0)]
    after = range(healed_step + 1, STEPS + 1)
    assert all(g0[s]["replica_groups"] == 2 for s in after)
    # the same weights and the same averaged gradients: the same norms on both groups
    assert [g1[s]["grad_norm"] for s in after] == [g0[s]["grad_norm"] for s in after]
    # group 1 resumed its own data position (saved after every step) where it stopped
    assert (
        "[group 1] [torchtitan] fault tolerance: data position of replica group 1 after its step"
        in out
    )


def test_the_whole_job_resumes_from_the_checkpoint_written_under_fault_tolerance_bitwise(
    killed_and_healed,
):
    """Both groups restarted from the step-60 checkpoint (group 0 wrote it, group 1 none;
    each group's data position of that step in its own files) train steps 61..70 as the
    first run did: the same losses and gradient norms, bitwise."""
    _, dump, _ = killed_and_healed
    ckpt = os.path.join(dump, "checkpoint")
    assert sorted(os.listdir(ckpt)) == [f"step-{s}" for s in (20, 40, 60, 70)]
    first = {g: _rows(os.path.join(dump, f"group_{g}", "metrics.jsonl")) for g in (0, 1)}
    shutil.rmtree(os.path.join(ckpt, f"step-{STEPS}"))
    for g in (0, 1):
        os.rename(  # the first run's records, apart from the resumed run's
            os.path.join(dump, f"group_{g}", "metrics.jsonl"),
            os.path.join(dump, f"group_{g}", "metrics_first.jsonl"),
        )
    summary, out = _ft_local(dump, slow=False)
    assert summary["exit_codes"] == [0, 0], out[-5000:]
    assert f"checkpoint: resumed from step {RESUME_AT}" in out
    for g in (0, 1):
        again = _rows(os.path.join(dump, f"group_{g}", "metrics.jsonl"))
        assert sorted(again) == list(range(RESUME_AT + 1, STEPS + 1))
        for s in again:
            assert (again[s]["loss"], again[s]["grad_norm"]) == (
                first[g][s]["loss"],
                first[g][s]["grad_norm"],
            ), (g, s)
