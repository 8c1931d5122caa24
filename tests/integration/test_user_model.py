"""A model package of one's own, outside torchtitan, registered without editing our files:
tests/integration/user_model/tinylm is copied to a temporary folder on PYTHONPATH and named by
--model.module=tinylm. It trains 2 steps on 2 ranks with FSDP2 (run_train.sh and torchrun: fresh
processes, the start-up memory prediction included) and plans a 4-rank job in a dry run; a bad
module name is one line before anything starts."""

import json
import os
import shutil
import subprocess

import run_tests

HERE = os.path.dirname(os.path.abspath(__file__))
ARGS = [
    "--model.module=tinylm",
    "--model.name=tinylm",
    "--model.flavor=small",
    "--job.description=tinylm",
    "--training.steps=2",
    "--training.seq_len=64",
    "--training.local_batch_size=2",
    "--metrics.enable_tensorboard=false",
    "--training.mixed_precision_param=float32",
]


def _package(tmp_path) -> dict:
    """The package in a folder of its own, that folder on PYTHONPATH."""
    shutil.copytree(os.path.join(HERE, "user_model", "tinylm"), tmp_path / "pkgs" / "tinylm")
    return {"PYTHONPATH": str(tmp_path / "pkgs")}


def test_a_model_package_of_ones_own_trains_and_plans(tmp_path):
    env = _package(tmp_path)
    dump = tmp_path / "run"
    rc, _, out = run_tests.launch(
        2, [*ARGS, f"--job.dump_folder={dump}"], str(tmp_path / "logs"), env, launcher="torchrun"
    )
    print(out[-3000:])
    assert rc == 0, out[-3000:]
    assert "tinylm small:" in out and "mesh {'dp_shard': 2}" in out
    records = [json.loads(line) for line in open(dump / "metrics.jsonl")]
    assert [r["step"] for r in records] == [1, 2] and all(r["loss"] > 0 for r in records)
    plan = json.load(open(dump / "plan.json"))
    units = [u["name"] for u in plan["model_parts"][0]["fsdp_units"]]
    assert units == ["tok_embeddings", "layers.0", "layers.1", "<root>"]
    assert (
        plan["memory_per_rank_role"][0]["predicted_peak_bytes"] > 0
    )  # the start-up prediction ran

    rc, _, out = run_tests.launch(
        4,
        [
            *ARGS,
            "--model.flavor=deeper",
            "--job.dry_run=true",
            f"--job.dump_folder={tmp_path / 'dry'}",
        ],
        str(tmp_path / "dry_logs"),
        env,
        launcher="torchrun",
    )
    print(out[-2000:])
    assert rc == 0, out[-3000:]
    assert "[dry run] tinylm deeper:" in out
    plan = json.load(open(tmp_path / "dry" / "plan.json"))
    assert plan["mesh"] == {"dp_shard": 4} and len(plan["model_parts"][0]["fsdp_units"]) == 6


def test_a_module_that_cannot_be_imported_is_one_line():
    proc = subprocess.run(
        [run_tests.RUN_TRAIN, "--model.module=no_such_pkg", "--model.name=x"],
        env={**os.environ, "NGPU": "2"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: --model.module='no_such_pkg': cannot import it (No module named 'no_such_pkg'); give a module that"
        " registers a model, importable from PYTHONPATH"
    ]
