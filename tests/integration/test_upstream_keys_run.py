"""Upstream's small keys in real runs: one 2-rank run checks several at once (the TensorBoard
folder per rank, the saved config file, the gc schedule, the profiler's active steps, the
module tree, hf_assets_path's tokenizer, the lr schedule's total_steps and sqrt decay, Adam with
for-loop kernels, the loader's and validation's options, no colours); a 1-rank run trains with
training.dtype=bfloat16."""

import dataclasses
import json
import math
import os
from types import SimpleNamespace

import pytest
import run_tests

from torchtitan.config import build_config
from torchtitan.training.lr_schedule import lr_factor

ROOT = run_tests.ROOT
CONFIG = os.path.join(ROOT, "train_configs", "llama3_debug.toml")
TOKENIZER = os.path.join(ROOT, "tests", "assets", "tokenizer")


def _run(args, ngpu, log_dir):
    """run_train.sh's run of `args` (forked ranks: run_tests.launch); its console as .stdout."""
    rc, _, out = run_tests.launch(ngpu, args, str(log_dir))
    assert rc == 0, out[-3000:]
    return SimpleNamespace(stdout=out, stderr="")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    dump = tmp_path_factory.mktemp("keys") / "run"
    args = [
        "--model.flavor=tiny",
        "--training.steps=4",
        "--training.seq_len=32",
        "--training.local_batch_size=2",
        f"--job.dump_folder={dump}",
        "--metrics.save_tb_folder=board",
        "--metrics.save_for_all_ranks",
        "--metrics.disable_color_printing",
        "--job.save_config_file=saved/job.toml",
        "--training.gc_freq=2",
        "--profiling.enable_profiling",
        "--profiling.profile_freq=2",
        "--profiling.profiler_active=2",
        "--profiling.profiler_warmup=0",
        "--model.print_after_conversion",
        f"--model.hf_assets_path={TOKENIZER}",
        "--checkpoint.enable",
        "--checkpoint.interval=4",
        "--lr_scheduler.total_steps=8",
        "--lr_scheduler.decay_type=sqrt",
        "--lr_scheduler.warmup_steps=1",
        "--optimizer.name=Adam",
        "--optimizer.implementation=for-loop",
        "--training.dataloader.num_workers=2",
        "--training.dataloader.persistent_workers",
        "--training.dataloader.prefetch_factor=3",
        "--validation.enable",
        "--validation.local_batch_size=1",
        "--validation.seq_len=16",
        "--validation.steps=1",
        "--validation.freq=4",
        "--validation.at_start=false",
        "--validation.dataloader.num_workers=1",
        "--planning.memory_budget_gib=none",  # as the fast launcher sets it: the saved config's
    ]
    return dump, args, _run(args, ngpu=2, log_dir=dump.parent / "ranks")


def test_tensorboard_folder_of_every_rank(two_ranks):
    dump, _, _ = two_ranks
    for rank in (0, 1):
        events = list((dump / "board" / f"rank_{rank}").glob("events.out.tfevents.*"))
        assert len(events) == 1 and events[0].stat().st_size > 0
    assert not (dump / "tb").exists()


def test_saved_config_reads_back_to_the_runs_config(two_ranks):
    dump, args, proc = two_ranks
    saved = dump / "saved" / "job.toml"
    assert f"[torchtitan] config written to {saved}" in proc.stdout
    again = build_config(["--job.config_file", str(saved)])[0]
    ran = build_config(["--job.config_file", CONFIG, *args])[0]
    assert dataclasses.replace(again, job=dataclasses.replace(again.job, config_file=CONFIG)) == ran


def test_gc_collects_after_every_second_step(two_ranks):
    lines = [x for x in two_ranks[2].stdout.splitlines() if x.startswith("[torchtitan] gc after")]
    assert [x.split(":")[0] for x in lines] == [
        "[torchtitan] gc after step 2",
        "[torchtitan] gc after step 4",
    ]


def test_profiler_traces_two_active_steps_per_block(two_ranks):
    dump = two_ranks[0]
    folders = sorted(p.name for p in (dump / "profile_traces").iterdir())
    assert folders == ["iteration_2", "iteration_4"]
    for it, steps in (("iteration_2", {1, 2}), ("iteration_4", {3, 4})):
        for rank in (0, 1):
            events = json.loads(
                (dump / "profile_traces" / it / f"rank{rank}_trace.json").read_text()
            )
            names = {e.get("name", "") for e in events["traceEvents"]}
            assert {n for n in names if n.startswith("ProfilerStep#")} == {
                f"ProfilerStep#{s}" for s in steps
            }


def test_module_tree_tokenizer_lr_loader_validation_and_no_colour(two_ranks):
    dump, _, proc = two_ranks
    out = proc.stdout
    assert "[torchtitan] model after conversion:\n" in out and "(layers): ModuleDict(" in out
    marker = json.loads((dump / "checkpoint" / "step-4" / ".complete").read_text())
    assert marker["tokenizer"] == os.path.join(TOKENIZER, "tokenizer.json")
    saved = build_config(["--job.config_file", str(dump / "saved" / "job.toml")])[0]
    records = [json.loads(x) for x in (dump / "metrics.jsonl").read_text().splitlines()]
    lrs = [r["lr"] for r in records if "loss" in r]
    want = [saved.optimizer.lr * lr_factor(s, 8, saved.lr_scheduler) for s in range(4)]
    assert lrs == pytest.approx(want, rel=1e-12)
    assert want[-1] > saved.optimizer.lr * saved.lr_scheduler.min_lr_factor  # 8-step schedule
    assert "2 loader worker(s)" in out
    val = [r for r in records if "validation_loss" in r]
    assert [r["step"] for r in val] == [4] and math.isfinite(val[0]["validation_loss"])
    assert "\x1b[" not in out + proc.stderr


def test_training_dtype_bfloat16_trains_bf16_parameters(tmp_path):
    dump = tmp_path / "bf16"
    proc = _run(
        [
            "--model.flavor=tiny",
            "--training.steps=2",
            "--training.seq_len=32",
            "--training.local_batch_size=2",
            "--training.dtype=bfloat16",
            "--metrics.enable_tensorboard=false",
            "--checkpoint.enable",
            "--checkpoint.interval=2",
            f"--job.dump_folder={dump}",
        ],
        ngpu=1,
        log_dir=tmp_path / "ranks",
    )
    assert "params bfloat16 (training.dtype)" in proc.stdout
    losses = run_tests.read_losses(str(dump))
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    import torch
    from torch.distributed.checkpoint import FileSystemReader

    meta = FileSystemReader(str(dump / "checkpoint" / "step-2")).read_metadata()
    dtypes = {
        k.split(".")[0]: v.properties.dtype
        for k, v in meta.state_dict_metadata.items()
        if hasattr(v, "properties") and (k.startswith("model.") or k.endswith("exp_avg"))
    }
    assert dtypes == {"model": torch.bfloat16, "optimizer": torch.bfloat16}, dtypes
