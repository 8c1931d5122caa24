"""Semi-synchronous replica groups on real runs (scripts/ft_local.py: a lighthouse and 2 groups
of 1 CPU rank, torchft's LocalSGD or DiLoCo in the trainer) against the same algorithm written
out by hand over 2 replicas in one process (semi_sync_reference.py), on the same batches:
every loss of both groups within 1e-6."""

import json
import os
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


def _group_losses(dump: str, method: str) -> list[list[float]]:
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "scripts", "ft_local.py"),
            "--groups=2",
            "--ranks=1",
            f"--dump={dump}",
            "--timeout=200",
            "--",
            *TINY,
            f"--fault_tolerance.semi_sync_method={method}",
            f"--fault_tolerance.sync_steps={SYNC}",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-5000:]
    losses = []
    for g in (0, 1):
        with open(os.path.join(dump, f"group_{g}", "metrics.jsonl")) as f:
            rows = {r["step"]: r for r in map(json.loads, f) if "loss" in r}
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
        "diloco,local_sgd",
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
    return {m: (_group_losses(str(tmp / m), m), want[m]) for m in ("diloco", "local_sgd")}


@pytest.mark.parametrize("method", ["diloco", "local_sgd"])
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
