"""--metrics.enable_wandb: a 1-rank, 3-step run in W&B offline mode (no network) leaves an
offline run under <dump_folder>/wandb whose history holds, step by step, exactly the scalars of
metrics.jsonl (training and validation) and of the TensorBoard events, with the job config as
the run config and a clean exit."""

import glob
import json
import os

import pytest
import run_tests
import wandb_records

pytest.importorskip("wandb")  # the dev extra installs it

# metrics.jsonl keys that are not scalars for the sinks (bookkeeping of the record itself)
NOT_SCALARS = {"step", "elapsed_sec", "eta_sec", "validation_batches", "validation_time"}


def _tensorboard(dump: str) -> dict:
    """{step: {tag: value}} of the run's TensorBoard events."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(os.path.join(dump, "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    out: dict = {}
    for tag in acc.Tags()["scalars"]:
        for event in acc.Scalars(tag):
            out.setdefault(event.step, {})[tag] = event.value
    return out


def _offline_env(tmp_path) -> dict:
    home = str(tmp_path / "wandb_home")  # nothing of wandb's own lands in the real home
    return {
        "WANDB_MODE": "offline",
        "WANDB_PROJECT": "titan-test",
        "WANDB_DIR": home,
        "WANDB_CONFIG_DIR": os.path.join(home, "config"),
        "WANDB_CACHE_DIR": os.path.join(home, "cache"),
        "WANDB_DATA_DIR": os.path.join(home, "data"),
        "WANDB_ARTIFACT_DIR": os.path.join(home, "artifacts"),
    }


def test_offline_wandb_run_logs_what_metrics_jsonl_and_tensorboard_hold(tmp_path):
    dump = str(tmp_path / "run")
    env = _offline_env(tmp_path)
    rc, _, out = run_tests.run(
        1,
        [
            "--training.steps=3",
            "--metrics.enable_wandb=true",
            "--metrics.enable_tensorboard=true",
            "--job.description=wandb check",
            "--validation.enable=true",
            "--validation.freq=3",
            "--validation.steps=1",
        ],
        dump,
        extra_env=env,
    )
    assert rc == 0, out[-3000:]
    (run_dir,) = glob.glob(os.path.join(dump, "wandb", "offline-run-*"))
    run = wandb_records.read_run(run_dir)
    assert (run["name"], run["project"], run["exit_code"]) == ("wandb check", "titan-test", 0)
    assert (
        run["config"]["training"]["steps"] == 3 and run["config"]["metrics"]["enable_wandb"] is True
    )

    with open(os.path.join(dump, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if line.strip()]
    expected: dict = {}  # step -> what the sinks got: the records' numbers, validation beside training
    for r in records:
        expected.setdefault(r["step"], {}).update(
            {k: v for k, v in r.items() if k not in NOT_SCALARS and isinstance(v, (int, float))}
        )
    assert sorted(expected) == [0, 1, 2, 3]  # validation at start, steps 1-3 (+ validation after 3)
    assert (
        "validation_loss" in expected[3]
        and "loss" in expected[3]
        and "validation_loss" in expected[0]
    )
    history = {
        row["_step"]: {k: v for k, v in row.items() if not k.startswith("_")}
        for row in run["history"]
    }
    assert history == expected

    last = [r for r in records if "loss" in r][-1]
    for key in ("loss", "grad_norm", "lr", "tokens_per_sec", "tokens_seen", "memory_rss_gib"):
        assert run["summary"][key] == last[key], key
    assert run["summary"]["validation_loss"] == records[-1]["validation_loss"]

    tb = _tensorboard(dump)  # the same tags at the same steps (float32 there)
    assert {s: set(v) for s, v in tb.items()} == {s: set(v) for s, v in history.items()}
    for step, values in history.items():
        for key, value in values.items():
            assert tb[step][key] == pytest.approx(value, rel=1e-6), (step, key)


def test_failed_training_finishes_the_wandb_run_as_failed(tmp_path):
    # the loss overflows at step 2: NonFiniteLossError leaves the training loop
    dump = str(tmp_path / "nan")
    rc, _, out = run_tests.run(
        1,
        [
            "--training.steps=3",
            "--metrics.enable_wandb=true",
            "--optimizer.lr=1e25",
            "--training.max_norm=0",
            "--lr_scheduler.warmup_steps=0",
            "--job.description=",
        ],
        dump,
        extra_env=_offline_env(tmp_path),
    )
    assert rc == 1 and "at step 2: training stopped" in out, out[-3000:]
    (run_dir,) = glob.glob(os.path.join(dump, "wandb", "offline-run-*"))
    run = wandb_records.read_run(run_dir)
    assert run["exit_code"] == 1
    assert [row["_step"] for row in run["history"]] == [1]  # step 1 logged, then the failure
    assert run["name"] == "nan"  # no job.description: the dump folder's name
