"""Upstream's [checkpoint] keys on real 2-rank runs, as upstream's integration cases use them
(tests/integration_tests/features.py: full_checkpoint, model_only_hf_checkpoint,
last_save_model_only_fp32 / _bf16, optional_checkpoint, pp_dp_tp), each asserting what was
and was not loaded or saved; and their bad values, refused in one line before launch.

One source run (A: FSDP 2, 6 steps, saves after steps 1, 3 and 6, exports Hugging Face
weights) feeds the others. The schedule is warmup 2 then flat (decay_ratio 0), so a schedule
started fresh at any step gives the lr of a fresh run's step 1: 1e-3, then 2e-3.
"""

import json
import os
import shutil
import warnings
from types import SimpleNamespace

import pytest
import run_tests
import torch
import torch.distributed.checkpoint as dcp
from config_helpers import config_error
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from torchtitan.checks import load_config

FLAT_LR = ["--lr_scheduler.decay_ratio=0"]
CKPT = ["--checkpoint.enable=true", "--checkpoint.interval=3"]
SOURCE = [
    *FLAT_LR,
    *CKPT,
    "--training.steps=6",
    "--checkpoint.enable_first_step_checkpoint=true",
    "--checkpoint.last_save_in_hf=true",
]


def _train(dump: str, overrides: list[str], ngpu: int = 2) -> str:
    rc, _, log = run_tests.run(ngpu, overrides, dump)
    assert rc == 0, log[-3000:]
    return log


def _records(dump: str) -> dict[int, dict]:
    with open(os.path.join(dump, "metrics.jsonl")) as f:
        return {r["step"]: r for r in map(json.loads, filter(str.strip, f)) if "loss" in r}


def _marker(path: str) -> dict:
    with open(os.path.join(path, ".complete")) as f:
        return json.load(f)


def _tensors(path: str, prefix: str) -> dict[str, torch.Tensor]:
    """The tensors of a DCP checkpoint whose keys start with `prefix`, read in this process."""
    meta = FileSystemReader(path).read_metadata().state_dict_metadata
    out = {
        k: torch.empty(m.size, dtype=m.properties.dtype)
        for k, m in meta.items()
        if k.startswith(prefix) and isinstance(m, TensorStorageMetadata)
    }
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(out, checkpoint_id=path, no_dist=True)
    return out


def _keys(path: str) -> set[str]:
    return set(FileSystemReader(path).read_metadata().state_dict_metadata)


def _copy_step(source: str, step: int, dump: str) -> None:
    os.makedirs(os.path.join(dump, "checkpoint"))
    shutil.copytree(
        os.path.join(source, "checkpoint", f"step-{step}"),
        os.path.join(dump, "checkpoint", f"step-{step}"),
    )


def _close(a: float, b: float, rtol: float) -> bool:
    return abs(a - b) <= rtol * abs(b)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> str:
    dump = str(tmp_path_factory.mktemp("upstream_keys") / "A")
    _train(dump, SOURCE)
    return dump


@pytest.fixture(scope="module")
def weights_only(source, tmp_path_factory) -> tuple[str, str]:
    """B: A's step-6 weights as initial_load_path (model only), load_only: (dump, log)."""
    dump = str(tmp_path_factory.mktemp("upstream_keys") / "B")
    start = os.path.join(source, "checkpoint", "step-6")
    log = _train(
        dump,
        [
            *FLAT_LR,
            "--training.steps=2",
            "--checkpoint.enable=true",
            "--checkpoint.load_only=true",
            f"--checkpoint.initial_load_path={start}",
        ],
    )
    return dump, log


def test_first_step_checkpoint_and_full_checkpoint_resume(source, tmp_path):
    # enable_first_step_checkpoint: step-1 besides the interval's step-3 and the last step-6,
    # each a full checkpoint; the last one's marker names its Hugging Face twin.
    folder = os.path.join(source, "checkpoint")
    assert sorted(os.listdir(folder)) == ["step-1", "step-3", "step-6"]
    assert [_marker(os.path.join(folder, f"step-{s}"))["model_only"] for s in (1, 3, 6)] == [
        False
    ] * 3
    assert _marker(os.path.join(folder, "step-6"))["hf_export"] == os.path.join(
        source, "hf", "step-6"
    )
    # full_checkpoint: the same job resumes from step-3 and trains steps 4-6 bitwise as A did;
    # with last_save_model_only and export_dtype bfloat16 its last save is A's step-6 weights
    # in bf16 (upstream's last_save_model_only_bf16), nothing else.
    dump = str(tmp_path / "R")
    _copy_step(source, 3, dump)
    log = _train(
        dump,
        [
            *FLAT_LR,
            *CKPT,
            "--training.steps=6",
            "--checkpoint.last_save_model_only=true",
            "--checkpoint.export_dtype=bfloat16",
        ],
    )
    assert f"checkpoint: resumed from step 3 ({dump}/checkpoint/step-3)\n" in log
    a, r = _records(source), _records(dump)
    assert sorted(r) == [4, 5, 6]
    assert [r[s]["loss"] for s in (4, 5, 6)] == [a[s]["loss"] for s in (4, 5, 6)]
    last = os.path.join(dump, "checkpoint", "step-6")
    assert (_marker(last)["model_only"], _marker(last)["dtype"]) == (True, "bfloat16")
    assert {k.split(".")[0] for k in _keys(last)} == {"model"}
    saved, straight = _tensors(last, "model."), _tensors(os.path.join(folder, "step-6"), "model.")
    assert sorted(saved) == sorted(straight) and len(saved) == 39
    for k, v in saved.items():
        assert v.dtype == torch.bfloat16 and torch.equal(v, straight[k].to(torch.bfloat16)), k


def test_optional_checkpoint_starts_the_excluded_parts_fresh(source, weights_only, tmp_path):
    # upstream's optional_checkpoint: A's FSDP step-6 loads into TP 2 without its optimizer,
    # lr schedule and data position; the model and the train state (step, tokens) load.
    dump = str(tmp_path / "O")
    _copy_step(source, 6, dump)
    log = _train(
        dump,
        [
            *FLAT_LR,
            "--checkpoint.enable=true",
            "--checkpoint.interval=7",
            "--checkpoint.exclude_from_loading=lr_scheduler,dataloader,optimizer",
            "--checkpoint.last_save_model_only=true",
            "--parallelism.tensor_parallel_degree=2",
            "--training.local_batch_size=8",
            "--training.steps=8",
        ],
    )
    assert (
        f"checkpoint: resumed from step 6 ({dump}/checkpoint/step-6); RNG states not restored"
        " (saved by mesh {'dp_shard': 2}, world size 2); not loaded, starting fresh: optimizer,"
        " lr_scheduler, dataloader\n"
    ) in log
    a, o, b = _records(source), _records(dump), _records(weights_only[0])
    assert sorted(o) == [7, 8] and o[7]["tokens_seen"] == 7 * 8 * 64
    # the schedule restarted: a fresh run's step-1 and step-2 lr
    assert (o[7]["lr"], o[8]["lr"]) == (a[1]["lr"], a[2]["lr"]) == (1e-3, 2e-3)
    # the data restarted and Adam started from zero moments: steps 7-8 are B's steps 1-2 (the
    # same weights, fresh optimizer and data), up to TP's other summation order
    assert _close(o[7]["loss"], b[1]["loss"], 1e-6), (o, b)
    assert _close(o[8]["loss"], b[2]["loss"], 1e-5), (o, b)
    # the optimizer saved after step 7 has taken one step, not seven
    steps = _tensors(os.path.join(dump, "checkpoint", "step-7"), "optimizer.state.")
    steps = {k: v for k, v in steps.items() if k.endswith(".step")}
    assert len(steps) == 39 and {float(v) for v in steps.values()} == {1.0}
    # upstream's last_save_model_only_fp32: the last save holds the fp32 weights only
    last = os.path.join(dump, "checkpoint", "step-8")
    assert (_marker(last)["model_only"], _marker(last)["dtype"]) == (True, "float32")
    assert {k.split(".")[0] for k in _keys(last)} == {"model"}
    assert {v.dtype for v in _tensors(last, "model.").values()} == {torch.float32}


def test_initial_weights_with_load_only_save_nothing(source, weights_only):
    dump, log = weights_only
    start = os.path.join(source, "checkpoint", "step-6")
    assert f"checkpoint: weights loaded from {start} (initial_load_path); starting at step 0" in log
    b, a = _records(dump), _records(source)
    assert sorted(b) == [1, 2] and b[1]["lr"] == a[1]["lr"]
    assert not os.path.exists(os.path.join(dump, "checkpoint"))  # load_only: no save at all
    assert "checkpoint step-" not in log


def test_model_only_hf_checkpoint_and_pinned_async_on_cpu(source, weights_only, tmp_path):
    # upstream's model_only_hf_checkpoint: the exported Hugging Face folder starts a run with
    # initial_load_model_only + initial_load_in_hf: A's step-6 weights again, as in B.
    dump = str(tmp_path / "H")
    hf = os.path.join(source, "hf", "step-6")
    # upstream's command names the checkpoint's step-6 (upstream exports into it): this fork
    # follows the step's marker to the Hugging Face folder it exported beside it
    step = os.path.join(source, "checkpoint", "step-6")
    log = _train(
        dump,
        [
            *FLAT_LR,
            "--training.steps=2",
            "--checkpoint.enable=true",
            "--checkpoint.interval=1",
            "--checkpoint.async_mode=async_with_pinned_mem",
            f"--checkpoint.initial_load_path={step}",
            "--checkpoint.initial_load_model_only=true",
            "--checkpoint.initial_load_in_hf=true",
        ],
    )
    assert f"checkpoint: weights loaded from Hugging Face folder {hf} (" in log
    h, b = _records(dump), _records(weights_only[0])
    assert [h[s]["loss"] for s in (1, 2)] == [b[s]["loss"] for s in (1, 2)]
    # async_with_pinned_mem on CPU: one note, then async saves (step 1 in the background)
    assert log.count("async_mode=async_with_pinned_mem: pinned memory is CUDA's") == 1
    assert "checkpoint step-1: staged in " in log
    assert "checkpoint step-1 written in the background" in log
    assert sorted(os.listdir(os.path.join(dump, "checkpoint"))) == ["step-1", "step-2"]


def test_initial_full_checkpoint_continues_another_run(source, tmp_path):
    # initial_load_model_only=false: A's step-3 is a full checkpoint of another run; this run
    # (its own folder empty) continues at step 4 with A's optimizer, schedule and data.
    dump = str(tmp_path / "F")
    start = os.path.join(source, "checkpoint", "step-3")
    log = _train(
        dump,
        [
            *FLAT_LR,
            "--training.steps=5",
            "--checkpoint.enable=true",
            f"--checkpoint.initial_load_path={start}",
            "--checkpoint.initial_load_model_only=false",
        ],
    )
    assert f"checkpoint: resumed from step 3 ({start}, initial_load_path)\n" in log
    a, f = _records(source), _records(dump)
    assert sorted(f) == [4, 5] and [f[4]["loss"], f[4]["lr"]] == [a[4]["loss"], a[4]["lr"]]


def test_fresh_schedule_sets_the_lr_over_a_loaded_optimizer():
    # exclude_from_loading=lr_scheduler alone: the optimizer state brings the lr saved with it
    # (step 5's); the manager's apply() hands the lr back to the fresh schedule (its step 1).
    from torch.optim.lr_scheduler import LambdaLR

    from torchtitan.checkpoint.states import LRSchedulerState, OptimizerState

    def build():  # warmup 2, then flat: the schedule of the runs above
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        schedule = LambdaLR(opt, lambda step: (step + 1) / 3 if step < 2 else 1.0)
        return model, SimpleNamespace(optimizers=[opt], schedulers=[schedule])

    model, parts = build()
    for _ in range(5):
        model(torch.ones(1, 4)).sum().backward()
        parts.optimizers[0].step()
        parts.schedulers[0].step()
    saved = OptimizerState([model], parts).state_dict()
    model2, fresh = build()
    model2.load_state_dict(model.state_dict())
    OptimizerState([model2], fresh).load_state_dict(saved)
    assert fresh.optimizers[0].param_groups[0]["lr"] == 3e-3  # step 5's, loaded
    LRSchedulerState(fresh).apply()
    assert fresh.optimizers[0].param_groups[0]["lr"] == 1e-3  # the fresh schedule's step 1


@pytest.mark.slow
def test_pp_dp_tp_resume(tmp_path):
    # upstream's pp_dp_tp: 8 ranks (PP 2 x FSDP 2 x TP 2) save, and the same job resumes
    dump = str(tmp_path / "pp_dp_tp")
    layout = [
        *FLAT_LR,
        "--checkpoint.enable=true",
        "--checkpoint.interval=2",
        "--training.steps=4",
        "--parallelism.pipeline_parallel_degree=2",
        "--parallelism.tensor_parallel_degree=2",
        "--training.local_batch_size=4",
    ]
    _train(dump, layout, ngpu=8)
    straight = _records(dump)
    shutil.rmtree(os.path.join(dump, "checkpoint", "step-4"))
    log = _train(dump, layout, ngpu=8)
    assert f"checkpoint: resumed from step 2 ({dump}/checkpoint/step-2)\n" in log
    resumed = _records(dump)
    assert [resumed[s]["loss"] for s in (3, 4)] == [straight[s]["loss"] for s in (3, 4)]


# ---------------------------------------------------------------- refused before launch


def _error(tmp_path, *argv: str) -> str:
    return config_error([f"--job.dump_folder={tmp_path}", *argv])


def test_bad_keys_refused_in_one_line(tmp_path):
    parts = "optimizer, lr_scheduler, dataloader, train_state"
    assert _error(tmp_path, "--checkpoint.initial_load_in_hf_quantized=true") == (
        "--checkpoint.initial_load_in_hf_quantized: quantized Hugging Face weights (e.g."
        " DeepSeek-V3's fp8 blocks) are not read here; give a folder of unquantized (bf16 or"
        " fp32) weights and drop the key"
    )
    assert _error(
        tmp_path, "--checkpoint.enable=true", "--checkpoint.exclude_from_loading=optimizer,model"
    ) == (
        "--checkpoint.exclude_from_loading=model: the model is always loaded; exclude any of"
        f" {parts}, or start without the checkpoint"
    )
    assert _error(
        tmp_path, "--checkpoint.enable=true", "--checkpoint.exclude_from_loading=data_loader"
    ) == (f"--checkpoint.exclude_from_loading: unknown part 'data_loader'; the parts are {parts}")
    assert _error(tmp_path, "--checkpoint.exclude_from_loading=optimizer") == (
        "--checkpoint.exclude_from_loading=optimizer has no effect without"
        " --checkpoint.enable=true (or --checkpoint.initial_load_model_only=false); enable"
        " checkpointing or drop it"
    )
    assert _error(
        tmp_path,
        "--checkpoint.initial_load_path=/x",
        "--checkpoint.initial_load_in_hf=true",
        "--checkpoint.initial_load_model_only=false",
    ) == (
        "--checkpoint.initial_load_in_hf: a Hugging Face folder holds weights only, so"
        " --checkpoint.initial_load_model_only=false cannot load its training state; set it true"
    )
    assert _error(tmp_path, "--checkpoint.initial_load_in_hf=true") == (
        "--checkpoint.initial_load_in_hf: no folder to read; set --checkpoint.initial_load_path"
        " (or --model.hf_assets_path) to the Hugging Face model folder"
    )
    assert _error(tmp_path, "--checkpoint.load_only=true") == (
        "--checkpoint.load_only=True has no effect without --checkpoint.enable=true; enable"
        " checkpointing or drop it"
    )
    assert _error(
        tmp_path,
        "--checkpoint.enable=true",
        "--checkpoint.load_only=true",
        "--checkpoint.last_save_in_hf=true",
    ) == (
        "--checkpoint.last_save_in_hf writes a save, --checkpoint.load_only=true forbids every"
        " save; drop one of them"
    )


def test_bad_initial_load_folders_refused_in_one_line(source, tmp_path):
    folder = os.path.join(source, "checkpoint")
    hf = ["--checkpoint.initial_load_in_hf=true"]
    # (a step whose marker names its Hugging Face export is followed there: the test above)
    assert _error(tmp_path, f"--checkpoint.initial_load_path={folder}/step-3", *hf) == (
        f"--checkpoint.initial_load_in_hf: --checkpoint.initial_load_path '{folder}/step-3' has no"
        " config.json, it is not a Hugging Face model folder; it is a DCP checkpoint: drop"
        " --checkpoint.initial_load_in_hf to load it"
    )
    # upstream's fallback: no initial_load_path, the model's hf_assets_path (here a tokenizer only)
    assets = tmp_path / "assets"
    assets.mkdir()
    shutil.copy(_marker(os.path.join(folder, "step-6"))["tokenizer"], assets / "tokenizer.json")
    assert _error(tmp_path, f"--model.hf_assets_path={assets}", *hf) == (
        f"--checkpoint.initial_load_in_hf: --model.hf_assets_path '{assets}' has no config.json, it"
        " is not a Hugging Face model folder; give a Hugging Face model folder (config.json +"
        " *.safetensors)"
    )
    # initial_load_model_only=false needs a full checkpoint, not an export of weights
    weights = os.path.join(tmp_path, "weights")
    shutil.copytree(os.path.join(folder, "step-6"), weights)
    with open(os.path.join(weights, ".complete"), "w") as f:
        json.dump({**_marker(os.path.join(folder, "step-6")), "model_only": True}, f)
    assert _error(
        tmp_path,
        f"--checkpoint.initial_load_path={weights}",
        "--checkpoint.initial_load_model_only=false",
    ) == (
        f"--checkpoint.initial_load_model_only=false: '{weights}' holds weights only (no"
        " optimizer, schedule or data position); load it with"
        " --checkpoint.initial_load_model_only=true"
    )
    # another global batch cannot take the data position, unless it starts over
    dump = tmp_path / "batch"
    _copy_step(source, 6, str(dump))
    argv = [f"--job.dump_folder={dump}", "--model.flavor=tiny", "--checkpoint.enable=true"]
    argv += ["--training.global_batch_size=4", "--training.local_batch_size=2"]
    assert "start the data over with --checkpoint.exclude_from_loading=dataloader" in (
        config_error(argv, world_size=2)
    )
    cfg, _ = load_config([*argv, "--checkpoint.exclude_from_loading=dataloader"], 2)
    assert cfg.checkpoint.exclude_from_loading == ["dataloader"]
