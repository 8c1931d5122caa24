"""Semi-synchronous replica groups on real runs (scripts/ft_local.py: a lighthouse and 2 groups
of CPU ranks, torchft's LocalSGD or DiLoCo in the trainer):

- DiLoCo against the same algorithm written out by hand over 2 replicas in one process
  (semi_sync_reference.py), on the same batches: every loss of both groups within 1e-6
  (LocalSGD and Streaming DiLoCo against theirs: tests/unit/test_semi_sync.py, in one
  process; the reference worker takes them too: `local_sgd`, `diloco:2`);
- DiLoCo, one group killed and restarted: the other trains on alone, the restarted one
  waits for its next sync, heals there (bitwise its weights) and takes part in it; the
  whole job resumed from a checkpoint written mid-period repeats its steps bitwise."""

import json
import os
import shutil
import subprocess
import sys

import ft_runs
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.dirname(os.path.abspath(__file__))
STEPS, SYNC = 5, 2  # syncs after steps 2 and 4: the second with the outer momentum
OUTER_LR, OUTER_M = 0.7, 0.9  # the outer SGD's defaults ([fault_tolerance] outer_*)
TINY = [
    *ft_runs.TINY,
    f"--training.steps={STEPS}",
]


METHODS = {  # the reference's method: the run's keys
    "diloco": ["--fault_tolerance.semi_sync_method=diloco", f"--fault_tolerance.sync_steps={SYNC}"],
}


def _ft_local(dump: str, *args: str, ranks: int = 1, env: dict | None = None):
    return ft_runs.ft_local(dump, *args, ranks=ranks, env=env)


def _rows(dump: str, g: int, name: str = "metrics.jsonl") -> dict[int, dict]:
    return ft_runs.rows(os.path.join(dump, f"group_{g}", name))


def _group_losses(dump: str, method: str) -> list[list[float]]:
    _, out = _ft_local(dump, "--", *TINY, *METHODS[method])
    losses = []
    for g in (0, 1):
        rows = _rows(dump, g)
        assert sorted(rows) == list(range(1, STEPS + 1)), out[-3000:]
        assert all(r["replica_groups"] == 2 for r in rows.values())
        losses.append([rows[s]["loss"] for s in range(1, STEPS + 1)])
    return losses


def _references(tmp) -> dict[str, list[list[float]]]:
    out = os.path.join(tmp, "references.json")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=1",
        os.path.join(HERE, "semi_sync_reference.py"),
        out,
        ",".join(METHODS),
        "2",
        str(SYNC),
        str(OUTER_LR),
        str(OUTER_M),
        *TINY,
        f"--job.dump_folder={tmp}/reference",
    ]
    env = {**os.environ, "PYTHONPATH": ROOT, **ft_runs.QUICK_ENV}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    with open(out) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("semi_sync")
    want = _references(str(tmp))
    return {m: (_group_losses(str(tmp / m.replace(":", "_")), m), want[m]) for m in METHODS}


@pytest.mark.parametrize("method", list(METHODS))
def test_semi_sync_equals_its_reference_on_the_same_batches(runs, method):
    got, want = runs[method]
    for g in (0, 1):
        for s in range(STEPS):
            assert abs(got[g][s] - want[g][s]) <= 1e-6, (method, g, s + 1, got[g], want[g])
    # the groups train apart between syncs: their own batches, their own losses
    assert got[0][0] != got[1][0]


KILLED_STEPS, CHECKPOINT = 30, 26  # a checkpoint mid-period (syncs at 24 and 28)
KILLED = [  # DiLoCo, 2 groups of 2 ranks (FSDP)
    f"--training.steps={KILLED_STEPS}",
    *TINY[:-1],
    "--fault_tolerance.semi_sync_method=diloco",
    "--fault_tolerance.sync_steps=4",
    "--checkpoint.enable",
    f"--checkpoint.interval={CHECKPOINT}",
]


@pytest.fixture(scope="module")
def diloco_killed(tmp_path_factory):
    dump = str(tmp_path_factory.mktemp("diloco_killed"))
    # ~0.5 s more per step: group 0 is still training when the restarted group 1 is up (~6 s)
    summary, out = _ft_local(
        dump,
        "--kill=1@4",
        "--restart-at=5",
        "--",
        *KILLED,
        ranks=2,
        env={"TORCHTITAN_FAULT": "sleep=0.5@data"},
    )
    return summary, dump, out


def test_diloco_survives_a_lost_group_and_heals_it_at_the_next_sync(diloco_killed):
    summary, dump, out = diloco_killed
    assert summary["exit_codes"] == [0, 0], out[-5000:]
    assert summary["group0_steps"] == KILLED_STEPS
    assert "[group 1] [torchtitan] fault tolerance: waiting for the other replica groups" in out
    healed_step, digest = summary["healed"]
    assert summary["sent"] == [[healed_step, digest]], summary  # bitwise group 0's weights
    synced = int(healed_step) + 1  # group 0's sync it healed in (a multiple of sync_steps)
    assert synced % 4 == 0 and 4 < synced < CHECKPOINT, summary
    g0, g1 = _rows(dump, 0), _rows(dump, 1)
    # group 0 synced alone while group 1 was down (its first sync after the kill: step 8),
    # with it from the sync group 1 joined
    assert {g0[s]["replica_groups"] for s in range(8, synced)} == {1}
    assert all(g0[s]["replica_groups"] == 2 for s in range(synced, KILLED_STEPS + 1))
    # group 1 took part in that sync: its next step is group 0's next
    assert sorted(g1)[0] == synced + 1 and sorted(g1)[-1] == KILLED_STEPS


def test_diloco_whole_job_resumes_bitwise_from_a_checkpoint_mid_period(diloco_killed):
    """Each group's own checkpoint (replica_<id>/step-26: its weights, AdamW, DiLoCo's global
    weights and outer momentum) and data position: steps 27..30 again, bitwise."""
    _, dump, _ = diloco_killed
    ckpt = os.path.join(dump, "checkpoint")
    assert sorted(os.listdir(ckpt)) == ["replica_0", "replica_1"]
    for g in (0, 1):
        assert sorted(os.listdir(os.path.join(ckpt, f"replica_{g}"))) == [
            f"step-{CHECKPOINT}",
            f"step-{KILLED_STEPS}",
        ]
        shutil.rmtree(os.path.join(ckpt, f"replica_{g}", f"step-{KILLED_STEPS}"))
        os.rename(
            os.path.join(dump, f"group_{g}", "metrics.jsonl"),
            os.path.join(dump, f"group_{g}", "first.jsonl"),
        )
    summary, out = _ft_local(dump, "--", *KILLED, ranks=2)
    assert summary["exit_codes"] == [0, 0], out[-5000:]
    for g in (0, 1):
        at = f"{ckpt}/replica_{g}/step-{CHECKPOINT}"
        assert f"checkpoint: resumed from step {CHECKPOINT} ({at})" in out
        first, again = _rows(dump, g, "first.jsonl"), _rows(dump, g)
        assert sorted(again) == list(range(CHECKPOINT + 1, KILLED_STEPS + 1))
        for s in again:
            assert (again[s]["loss"], again[s]["grad_norm"]) == (
                first[s]["loss"],
                first[s]["grad_norm"],
            ), (g, s)
