"""Validation loss is the training loss's formula without the update: validating on the
training data before step 1 gives step 1's logged loss, bitwise, with gradient accumulation,
under pipeline parallel (forward-only schedules and the V schedules, which validate with a
discarded backward), with TP's loss parallel, for FSDP2 and SimpleFSDP. Validating never
changes training: the same losses and gradient norms as a run without it."""

import json
import os

import parity_cases
import run_tests

ON_TRAIN_DATA = [
    "--validation.enable=true",
    "--validation.dataset=pydoc",
    "--validation.dataset_split=train",
    "--validation.steps=1",
]
PP = [
    "--parallelism.pipeline_parallel_degree=2",
    "--parallelism.pipeline_parallel_microbatch_size=1",
]


def _records(dump):
    with open(os.path.join(dump, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def _run(tmp_path, name, ngpu, overrides):
    dump = str(tmp_path / name)
    rc, _, out = run_tests.run(ngpu, overrides, dump)
    assert rc == 0, out[-3000:]
    return _records(dump), out


def test_fsdp2_accum_validates_like_step_1_and_leaves_training_alone(tmp_path):
    # 2 ranks of FSDP2, local batch 1 of a global 8: 4 accumulation steps. Without the reshard
    # after validation, step 3 would train with the root unit's gradients doubled (torch 2.13).
    layout = ["--training.local_batch_size=1", "--training.steps=3"]
    records, out = _run(tmp_path, "val", 2, [*layout, *ON_TRAIN_DATA, "--validation.freq=2"])
    val = {r["step"]: r for r in records if "validation_loss" in r}
    train = [r for r in records if "loss" in r]
    assert sorted(val) == [0, 2, 3]  # at start, every freq steps, after the last step
    assert val[0]["validation_loss"] == train[0]["loss"], (val[0], train[0])
    assert "validation after step 2:  loss" in out
    plain, _ = _run(tmp_path, "plain", 2, layout)
    assert [(r["loss"], r["grad_norm"]) for r in train] == [
        (r["loss"], r["grad_norm"]) for r in plain
    ]


def test_v_schedule_simple_fsdp_validates_like_step_1(tmp_path):
    # 2 ranks: pp 2 (ZBVZeroBubble, 2 stages per rank), SimpleFSDP (its units gathered once per
    # pipeline step), 2 accumulation steps x 4 microbatches. (1F1B's forward-only eval and TP's
    # loss parallel: the PP and TP runs of test_hf_weights_run.py validate at start too.)
    records, _ = _run(
        tmp_path,
        "v",
        2,
        [
            *PP,
            "--parallelism.pipeline_parallel_schedule=ZBVZeroBubble",
            "--training.local_batch_size=4",
            "--parallelism.fsdp_implementation=simple_fsdp",
            "--training.steps=1",
            *ON_TRAIN_DATA,
        ],
    )
    val = [r for r in records if "validation_loss" in r]
    train = [r for r in records if "loss" in r]
    assert [r["step"] for r in val] == [0, 1]
    assert val[0]["validation_loss"] == train[0]["loss"], (val[0], train[0])


def test_pipeline_with_multi_token_prediction_validates_the_main_head_like_step_1(tmp_path):
    # DeepSeek-V3 with an MTP module on the last of 2 pipeline stages (1F1B, forward-only eval):
    # the stages get the MTP tokens they were built for, and validation scores the main head
    # over every position of the sequences, as training logs its loss.
    dump = str(tmp_path / "mtp_pp")
    rc, _, out = run_tests.run(
        2,
        [
            *PP,
            "--model.mtp_depth=1",
            "--training.local_batch_size=4",
            "--training.steps=1",
            *ON_TRAIN_DATA,
        ],
        dump,
        model=parity_cases.DS,
    )
    assert rc == 0, out[-3000:]
    records = _records(dump)
    val = [r for r in records if "validation_loss" in r]
    train = [r for r in records if "loss" in r]
    assert [r["step"] for r in val] == [0, 1]
    assert val[0]["validation_loss"] == train[0]["loss"], (val[0], train[0])
