"""Hugging Face weights through real runs: a pipeline-parallel run exports its last step
(one writer per stage), a tensor-parallel run starts from that folder and trains exactly as
from the run's own checkpoint of the same step, and scripts/convert_hf.py exports that
checkpoint to bitwise the same tensors."""

import glob
import json
import os
import subprocess
import sys

import run_tests

PP = "--parallelism.pipeline_parallel_degree=2"
TP = "--parallelism.tensor_parallel_degree=2"
ON_TRAIN_DATA = [
    "--validation.enable=true",
    "--validation.dataset_split=train",
    "--validation.steps=1",
    "--validation.freq=100",
]


def _tensors(folder):
    from safetensors.torch import load_file

    out = {}
    for file in glob.glob(os.path.join(folder, "*.safetensors")):
        out.update(load_file(file))
    return out


def _first_validation_is_step_1(dump):
    records = [json.loads(x) for x in open(os.path.join(dump, "metrics.jsonl")) if x.strip()]
    first_val = next(r for r in records if "validation_loss" in r)
    first_step = next(r for r in records if "loss" in r)
    assert first_val["step"] == 0 and first_val["validation_loss"] == first_step["loss"], (
        first_val,
        first_step,
    )


def test_export_from_pp_then_start_tp_from_it(tmp_path):
    src = str(tmp_path / "src")
    # The export run also validates on the training data before step 1: 1F1B's forward-only eval,
    # 4 accumulation steps x 2 microbatches, gives step 1's loss.
    rc, _, out = run_tests.run(
        2,
        [
            PP,
            "--training.steps=2",
            "--checkpoint.enable=true",
            "--checkpoint.last_save_in_hf=true",
            *ON_TRAIN_DATA,
        ],
        src,
    )
    assert rc == 0, out[-3000:]
    _first_validation_is_step_1(src)
    hf = os.path.join(src, "hf", "step-2")
    files = sorted(os.listdir(hf))
    assert files == [
        "config.json",
        "model-pp00-0000.safetensors",
        "model-pp01-0000.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
    ], files

    script = subprocess.run(
        [
            sys.executable,
            os.path.join(run_tests.ROOT, "scripts", "convert_hf.py"),
            os.path.join(src, "checkpoint", "step-2"),
            str(tmp_path / "script"),
        ],
        capture_output=True,
        text=True,
    )
    assert script.returncode == 0, script.stderr
    ours, theirs = _tensors(hf), _tensors(str(tmp_path / "script"))
    assert sorted(ours) == sorted(theirs) and all(ours[k].equal(theirs[k]) for k in ours)

    results = {}
    for name, path in (("hf", hf), ("dcp", os.path.join(src, "checkpoint", "step-2"))):
        dump = str(tmp_path / name)
        # Also validates on the training data before step 1 (TP's loss parallel: the same loss).
        rc, _, out = run_tests.run(
            2,
            [
                TP,
                "--training.steps=2",
                "--training.local_batch_size=8",
                f"--checkpoint.initial_load_path={path}",
                *ON_TRAIN_DATA,
            ],
            dump,
        )
        assert rc == 0, out[-3000:]
        results[name] = (run_tests.read_losses(dump), run_tests.read_grad_norms(dump))
        _first_validation_is_step_1(dump)
        if name == "hf":
            assert f"weights loaded from Hugging Face folder {hf}" in out, out[-3000:]
    assert results["hf"] == results["dcp"], results
