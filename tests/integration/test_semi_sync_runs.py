"""Semi-synchronous replica groups on real runs (scripts/ft_local.py: a lighthouse and 2 groups
of CPU ranks, torchft's LocalSGD or DiLoCo in the trainer):

- against the same algorithm written out by hand over 2 replicas in one process
  (semi_sync_reference.py), on the same batches: every loss of both groups within 1e-6
  (LocalSGD, DiLoCo, Streaming DiLoCo of 2 fragments);
- DiLoCo, one group killed and restarted: the other trains on alone, the restarted one
  waits for its next sync, heals there (bitwise its weights) and takes part in it; the
  whole job resumed from a checkpoint written mid-period repeats its steps bitwise."""

import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.dirname(os.path.abspath(__file__))
STEPS, SYNC = 5, 2  # syncs after steps 2 and 4: the second with the outer momentum
OUTER_LR, OUTER_M = 0.7, 0.9  # the outer SGD's defaults ([fault_tolerance] outer_*)
TINY = [
    "--model.flavor=tiny",
    "--training.seq_len=64",
    "--training.local_batch_size=2",
    "--training.device=cpu",
    "--training.mixed_precision_param=float32",
    "--metrics.log_freq=1",
    "--metrics.enable_tensorboard=false",
    "--lr_scheduler.warmup_steps=0",  # a constant lr: the reference steps the schedule twice
    "--lr_scheduler.decay_ratio=0",
    f"--training.steps={STEPS}",
]


METHODS = {  # the reference's method: the run's keys
    "diloco": ["--fault_tolerance.semi_sync_method=diloco", f"--fault_tolerance.sync_steps={SYNC}"],
    "local_sgd": [
        "--fault_tolerance.semi_sync_method=local_sgd",
        f"--fault_tolerance.sync_steps={SYNC}",
    ],
    "diloco:2": [
        "--fault_tolerance.semi_sync_method=diloco",
        "--fault_tolerance.num_fragments=2",
        f"--fault_tolerance.sync_steps={2 * SYNC}",
    ],
}


def _ft_local(dump: str, *args: str, ranks: int = 1, env: dict | None = None) -> tuple[dict, str]:
    env = {**os.environ, "PYTHONPATH": ROOT, **(env or {})}
    done = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "scripts", "ft_local.py"),
            "--groups=2",
            f"--ranks={ranks}",
            f"--dump={dump}",
            "--timeout=200",
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    out = done.stdout + done.stderr
    line = [ln for ln in out.splitlines() if ln.startswith("[ft_local] summary ")]
    assert done.returncode == 0 and line, out[-5000:]
    return json.loads(line[-1].split(" ", 2)[2]), out


def _rows(dump: str, g: int, name: str = "metrics.jsonl") -> dict[int, dict]:
    with open(os.path.join(dump, f"group_{g}", name)) as f:
        return {r["step"]: r for r in map(json.loads, f) if "loss" in r}


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
    done = subprocess.run(
        cmd, env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True, cwd=ROOT
    )
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


def test_the_references_tell_diloco_from_local_sgd(runs):
    """Up to the first sync both are local training; after it, DiLoCo's outer step (lr 0.7 on
    the averaged pseudo-gradient) is not LocalSGD's mean: the comparison can fail."""
    diloco, local_sgd = runs["diloco"][1], runs["local_sgd"][1]
    assert diloco[0][:SYNC] == local_sgd[0][:SYNC]
    assert all(abs(a - b) > 1e-4 for a, b in zip(diloco[0][SYNC:], local_sgd[0][SYNC:]))


KILLED = [  # DiLoCo, 2 groups of 2 ranks (FSDP), a checkpoint mid-period (syncs at 32, 36)
    "--training.steps=40",
    *TINY[:-1],
    "--fault_tolerance.semi_sync_method=diloco",
    "--fault_tolerance.sync_steps=4",
    "--checkpoint.enable",
    "--checkpoint.interval=34",
]


@pytest.fixture(scope="module")
def diloco_killed(tmp_path_factory):
    dump = str(tmp_path_factory.mktemp("diloco_killed"))
    # ~0.5 s more per step: group 0 is still training when the restarted group 1 is up (~8 s)
    summary, out = _ft_local(
        dump,
        "--kill=1@6",
        "--restart-at=8",
        "--",
        *KILLED,
        ranks=2,
        env={"TORCHTITAN_FAULT": "sleep=0.5@data"},
    )
    return summary, dump, out


def test_diloco_survives_a_lost_group_and_heals_it_at_the_next_sync(diloco_killed):
    summary, dump, out = diloco_killed
    assert summary["exit_codes"] == [0, 0] and summary["group0_steps"] == 40, out[-5000:]
    assert "[group 1] [torchtitan] fault tolerance: waiting for the other replica groups" in out
    healed_step, digest = summary["healed"]
    assert summary["sent"] == [[healed_step, digest]], summary  # bitwise group 0's weights
    synced = int(healed_step) + 1  # group 0's sync it healed in (a multiple of sync_steps)
    assert synced % 4 == 0 and 8 < synced < 34, summary
    g0, g1 = _rows(dump, 0), _rows(dump, 1)
    # group 0 synced alone while group 1 was down, with it from the sync group 1 joined
    assert {g0[s]["replica_groups"] for s in range(9, synced)} == {1}
    assert all(g0[s]["replica_groups"] == 2 for s in range(synced, 41))
    # group 1 took part in that sync: its next step is group 0's next
    assert sorted(g1)[0] == synced + 1 and sorted(g1)[-1] == 40


def test_diloco_whole_job_resumes_bitwise_from_a_checkpoint_mid_period(diloco_killed):
    """Each group's own checkpoint (replica_<id>/step-34: its weights, AdamW, DiLoCo's global
    weights and outer momentum) and data position: steps 35..40 again, bitwise."""
    _, dump, _ = diloco_killed
    ckpt = os.path.join(dump, "checkpoint")
    assert sorted(os.listdir(ckpt)) == ["replica_0", "replica_1"]
    for g in (0, 1):
        assert sorted(os.listdir(os.path.join(ckpt, f"replica_{g}"))) == ["step-34", "step-40"]
        shutil.rmtree(os.path.join(ckpt, f"replica_{g}", "step-40"))
        os.rename(
            os.path.join(dump, f"group_{g}", "metrics.jsonl"),
            os.path.join(dump, f"group_{g}", "first.jsonl"),
        )
    summary, out = _ft_local(dump, "--", *KILLED, ranks=2)
    assert summary["exit_codes"] == [0, 0], out[-5000:]
    for g in (0, 1):
        assert f"checkpoint: resumed from step 34 ({ckpt}/replica_{g}/step-34)" in out
        first, again = _rows(dump, g, "first.jsonl"), _rows(dump, g)
        assert sorted(again) == list(range(35, 41))
        for s in again:
            assert (again[s]["loss"], again[s]["grad_norm"]) == (
                first[s]["loss"],
                first[s]["grad_norm"],
            ), (g, s)
