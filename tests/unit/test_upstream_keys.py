"""Upstream's small keys, each doing what upstream's does: the loader's options, the validation
batch's shape, the TensorBoard folder, the profiler's active/warmup steps, the garbage
collector's schedule, the lr schedule's length and sqrt decay, Adam and the for-loop kernels,
training.dtype, deterministic_warn_only, the saved config file and hf_assets_path."""

import dataclasses
import gc
import json
import math
import os
import weakref

import pytest
import torch

from torchtitan.checks.data import check_tokenizer
from torchtitan.checks.upstream_keys import (
    check_gc_and_schedule,
    check_profiler_steps,
    check_training_dtype,
    check_validation_shape,
)
from torchtitan.config import ConfigError, build_config
from torchtitan.config.job_config import LRScheduler, Optimizer
from torchtitan.config.toml_writer import config_toml
from torchtitan.data.dataloader import (
    LoaderOptions,
    build_dataloader,
    loader_options,
    resolve_workers,
)
from torchtitan.data.tokenizer import Tokenizer, load_model_tokenizer, tokenizer_file
from torchtitan.data.validation import Validator, validation_shape
from torchtitan.observe.metrics import MetricsLogger, tensorboard_folder
from torchtitan.observe.profiling import Profiler
from torchtitan.training.garbage import GarbageSchedule
from torchtitan.training.lr_schedule import lr_factor, schedule_steps
from torchtitan.training.optimizer import build_optimizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cfg_of(*args):
    return build_config(list(args))[0]


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(
        "".join(json.dumps({"text": f"document {i} " * (5 + i % 7)}) + "\n" for i in range(60))
    )
    return str(path)


# --------------------------------------------------------------------- lr schedule, optimizer


def test_sqrt_decay_is_upstreams_one_minus_sqrt_of_progress():
    cfg = LRScheduler(warmup_steps=2, decay_type="sqrt", min_lr_factor=0.1)
    # 12 steps, 2 of warmup: 10 decay steps, progress (s - 2) / 9 from step 2 to step 11
    got = [lr_factor(s, 12, cfg) for s in range(2, 12)]
    want = [0.1 + 0.9 * (1 - math.sqrt((s - 2) / 9)) for s in range(2, 12)]
    assert got == pytest.approx(want, abs=1e-12)
    assert got[0] == 1.0 and got[-1] == pytest.approx(0.1, abs=1e-12)
    linear = [lr_factor(s, 12, dataclasses.replace(cfg, decay_type="linear")) for s in range(3, 11)]
    assert all(a < b for a, b in zip(got[1:-1], linear))  # sqrt drops faster at first


def test_total_steps_sets_the_schedule_length_auto_is_training_steps():
    assert schedule_steps(LRScheduler(), 10) == 10
    assert schedule_steps(LRScheduler(total_steps=40), 10) == 40
    cfg = LRScheduler(warmup_steps=2, total_steps=40)
    # a 10-step job of a 40-step schedule: still near the peak where the 10-step one ends at 0
    assert lr_factor(9, schedule_steps(cfg, 10), cfg) == pytest.approx(1 - 7 / 37, abs=1e-12)
    assert lr_factor(9, schedule_steps(LRScheduler(warmup_steps=2), 10), cfg) == 0.0


def _one_step(opt_cfg):
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(5))
    opt = build_optimizer([p], opt_cfg, "cpu")
    p.grad = torch.full((5,), 0.5)
    opt.step()
    return opt, p.detach().clone()


def test_adam_adds_weight_decay_to_the_gradient_adamw_decouples_it():
    base = Optimizer(lr=0.1, weight_decay=0.5, eps=1e-8)
    adam, p_adam = _one_step(dataclasses.replace(base, name="Adam"))
    adamw, p_adamw = _one_step(base)
    assert type(adam) is torch.optim.Adam and type(adamw) is torch.optim.AdamW
    torch.manual_seed(0)
    p0 = torch.randn(5)
    g = 0.5 + 0.5 * p0  # Adam: the decay joins the gradient; the first step moves lr x sign
    assert torch.allclose(p_adam, p0 - 0.1 * g / (g.abs() + 1e-8), atol=1e-6)
    assert torch.allclose(p_adamw, p0 * (1 - 0.1 * 0.5) - 0.1, atol=1e-6)


def test_for_loop_implementation_uses_neither_foreach_nor_fused():
    loop, p_loop = _one_step(Optimizer(implementation="for-loop"))
    assert loop.defaults["foreach"] is False and loop.defaults["fused"] is False
    _, p_foreach = _one_step(Optimizer(implementation="foreach"))
    assert torch.allclose(p_loop, p_foreach, rtol=0, atol=1e-7)


# --------------------------------------------------------------------- data loader, validation


def test_loader_options_from_the_section():
    cfg = cfg_of(
        "--training.dataloader.persistent_workers",
        "--training.dataloader.prefetch_factor=3",
        "--training.dataloader.pin_memory",
    )
    assert loader_options(cfg.training.dataloader, "cuda") == LoaderOptions(True, 3, True)
    assert loader_options(cfg.training.dataloader, "cpu") == LoaderOptions(True, 3, False)
    assert loader_options(cfg_of().training.dataloader, "cuda") == LoaderOptions(False, None, False)
    assert (resolve_workers("auto", "cuda"), resolve_workers("auto", "cpu")) == (2, 0)
    assert resolve_workers(3, "cpu") == 3


def test_loader_passes_the_options_to_torchs_dataloader(corpus):
    cfg = cfg_of(f"--training.dataset={corpus}", "--training.local_batch_size=2")
    opts = LoaderOptions(persistent_workers=True, prefetch_factor=3)
    with_workers = build_dataloader(cfg.training, Tokenizer(), 0, 1, 1, workers=2, options=opts)
    dl = with_workers._loader()
    assert (dl.num_workers, dl.persistent_workers, dl.prefetch_factor) == (2, True, 3)
    plain = build_dataloader(cfg.training, Tokenizer(), 0, 1, 1, options=opts)._loader()
    assert (plain.num_workers, plain.persistent_workers, plain.prefetch_factor) == (0, False, None)
    auto = build_dataloader(cfg.training, Tokenizer(), 0, 1, 1, workers=2)._loader()
    assert auto.prefetch_factor == 2 and auto.persistent_workers is False  # torch's defaults


def test_pin_memory_pins_each_batch(corpus, monkeypatch):
    cfg = cfg_of(
        f"--training.dataset={corpus}", "--training.local_batch_size=2", "--training.seq_len=16"
    )
    pinned = []

    def fake_pin(t, *args, **kwargs):  # CPU-only torch cannot pin: record the call
        pinned.append(t.shape)
        return t.clone()

    monkeypatch.setattr(torch.Tensor, "pin_memory", fake_pin)
    opts = LoaderOptions(pin_memory=True)
    it = iter(build_dataloader(cfg.training, Tokenizer(), 0, 1, 1, options=opts))
    pin_batches = [next(it) for _ in range(3)]
    plain = iter(build_dataloader(cfg.training, Tokenizer(), 0, 1, 1))
    assert pinned == [torch.Size([2, 17])] * 3
    for (x, y), (u, v) in zip(pin_batches, [next(plain) for _ in range(3)]):
        assert x.equal(u) and y.equal(v)


def test_validation_batch_shape_and_loader_are_validations_own(corpus):
    args = [
        f"--training.dataset={corpus}",
        "--training.local_batch_size=4",
        "--training.seq_len=32",
        "--validation.enable",
        f"--validation.dataset={corpus}",
        "--validation.dataset_split=train",
        "--validation.steps=2",
        "--validation.dataloader.num_workers=1",
        "--validation.dataloader.prefetch_factor=5",
    ]
    auto = cfg_of(*args)
    assert validation_shape(auto) == (4, 32)
    cfg = cfg_of(*args, "--validation.local_batch_size=3", "--validation.seq_len=16")
    assert validation_shape(cfg) == (3, 16)
    v = Validator(cfg, Tokenizer(), dp_rank=0, dp_degree=1, accum_steps=2)
    assert (v.workers, v.options.prefetch_factor) == (1, 5)
    batches = v.batches()
    assert len(batches) == 2 and all(len(b) == 2 for b in batches)
    assert {tuple(x.shape) for b in batches for x, _ in b} == {(3, 16)}
    assert (
        auto.training.local_batch_size == 4 and cfg.training.seq_len == 32
    )  # training's untouched


# --------------------------------------------------------------------- TensorBoard, profiler, gc


def test_tensorboard_folder_rank_zero_or_every_rank():
    assert tensorboard_folder("/d", "board", 0) == "/d/board"
    assert tensorboard_folder("/d", "board", 1) is None
    assert tensorboard_folder("/d", "board", 1, all_ranks=True) == "/d/board/rank_1"
    assert tensorboard_folder("/d", "board", 0, all_ranks=True) == "/d/board/rank_0"


def test_a_non_logging_rank_writes_only_its_own_tensorboard_events(tmp_path):
    folder = str(tmp_path / "board" / "rank_1")
    m = MetricsLogger(str(tmp_path), False, True, 2, tb_folder=folder)
    with m:
        m.log(1, {"loss": 1.5, "step_time": 0.1, "mfu": None})
        m.log_validation(1, {"validation_loss": 2.0}, 1, 0.1)
    assert [p.name[:20] for p in (tmp_path / "board" / "rank_1").iterdir()] == [
        "events.out.tfevents."
    ]
    assert not (tmp_path / "metrics.jsonl").exists()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(folder)
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == ["loss", "step_time", "validation_loss"]
    assert [e.value for e in acc.Scalars("loss")] == [1.5]


def _profile(tmp_path, freq, active, warmup, steps):
    cfg = cfg_of(
        "--profiling.enable_profiling",
        f"--profiling.profile_freq={freq}",
        f"--profiling.profiler_active={active}",
        f"--profiling.profiler_warmup={warmup}",
    ).profiling
    prof = Profiler(
        cfg,
        str(tmp_path),
        0,
        torch.device("cpu"),
        start_step=0,
        last_step=steps,
        log=lambda line: None,
    )
    with prof:
        for step in range(1, steps + 1):
            with prof.step(step):
                torch.ones(8, 8) @ torch.ones(8, 8)
    traces = {}
    for folder in sorted((tmp_path / "profile_traces").iterdir()):
        events = json.loads((folder / "rank0_trace.json").read_text())["traceEvents"]
        names = {e.get("name", "") for e in events}
        traces[folder.name] = sorted(n for n in names if n.startswith("ProfilerStep#"))
    return prof, traces


def test_profiler_traces_the_active_steps_that_end_at_each_multiple(tmp_path):
    prof, traces = _profile(tmp_path, freq=5, active=2, warmup=1, steps=12)
    assert traces == {
        "iteration_10": ["ProfilerStep#10", "ProfilerStep#9"],
        "iteration_5": ["ProfilerStep#4", "ProfilerStep#5"],
    }  # steps 11-12 start a block the run ends inside: not traced
    names = [prof._train_action(s).name for s in range(1, 11)]
    assert names == ["NONE", "NONE", "WARMUP", "RECORD", "RECORD_AND_SAVE"] * 2


def test_profiler_one_active_step_three_warmup_is_the_default(tmp_path):
    prof, traces = _profile(tmp_path, freq=4, active=1, warmup=3, steps=8)
    assert traces == {"iteration_4": ["ProfilerStep#4"], "iteration_8": ["ProfilerStep#8"]}
    assert [prof._train_action(s).name for s in range(1, 5)] == [
        "WARMUP",
        "WARMUP",
        "WARMUP",
        "RECORD_AND_SAVE",
    ]


class _Cycle:
    def __init__(self):
        self.me = self


def _cycle_ref():
    return weakref.ref(_Cycle())  # unreachable at once, freed only by the collector


def test_gc_freq_collects_every_rank_after_the_same_steps_only():
    was, lines = gc.isenabled(), []
    with GarbageSchedule(3, log=lines.append) as sched:
        assert not gc.isenabled()
        ref = _cycle_ref()
        assert sched.after_step(1) is None and sched.after_step(2) is None
        assert ref() is not None  # automatic collection is off
        assert sched.after_step(3) >= 1 and ref() is None
        assert sched.collections == 1
    assert gc.isenabled() == was
    assert len(lines) == 1 and lines[0].startswith("[torchtitan] gc after step 3: ")
    assert "uncollectable" not in lines[0]


def test_gc_freq_zero_leaves_pythons_schedule():
    with GarbageSchedule(0) as sched:
        assert gc.isenabled() and sched.after_step(50) is None and sched.collections == 0


def test_gc_debug_collects_after_every_step_and_logs_counts():
    lines = []
    with GarbageSchedule(50, debug=True, log=lines.append) as sched:
        for step in (1, 2):
            ref = _cycle_ref()
            found = sched.after_step(step)
            assert found >= 1 and ref() is None
    assert sched.collections == 2 and len(lines) == 2
    assert lines[0].startswith("[torchtitan] gc after step 1: ") and " uncollectable, " in lines[0]


# --------------------------------------------------------------------- dtype, determinism


def test_training_dtype_bfloat16_turns_parameters_not_buffers_and_keeps_ties():
    from torchtitan.training.planned_job import with_param_dtype

    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10))
    model[1].weight = model[0].weight  # tied
    model.register_buffer("table", torch.zeros(3, device="meta"))
    with_param_dtype(model, "bfloat16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model[1].weight is model[0].weight and model.table.dtype == torch.float32
    assert len(list(model.parameters())) == 2  # embedding (tied) + linear bias
    same = torch.nn.Linear(2, 2)
    assert with_param_dtype(same, "float32").weight.dtype == torch.float32


@pytest.mark.parametrize("warn_only", [False, True])
def test_deterministic_warn_only(warn_only):
    from torchtitan.train import seed_and_determinism

    cfg = cfg_of("--training.deterministic", f"--debug.deterministic_warn_only={warn_only}")
    try:
        seed_and_determinism(cfg, torch.device("cpu"))
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled() is warn_only
    finally:
        torch.use_deterministic_algorithms(False)


# --------------------------------------------------------------------- saved config, tokenizer


def test_saved_config_reads_back_to_the_same_config(tmp_path):
    cfg = cfg_of(
        "--job.config_file",
        os.path.join(ROOT, "tests/upstream/llama3_debug_model.toml"),
        "--job.description",
        'quotes " and \\ backslash, é\ttab',
        "--training.steps=7",
        "--training.dataloader.prefetch_factor=3",
        "--lr_scheduler.total_steps=30",
        "--optimizer.eps=1e-12",
        "--training.dataset_mix",
        "a.jsonl:0.7,b.jsonl:0.3",
    )
    path = tmp_path / "saved.toml"
    path.write_text(config_toml(cfg))
    again = cfg_of("--job.config_file", str(path))
    assert dataclasses.replace(again, job=dataclasses.replace(again.job, config_file="")) == (
        dataclasses.replace(cfg, job=dataclasses.replace(cfg.job, config_file=""))
    )
    assert again.training.dataloader.prefetch_factor == 3 and again.optimizer.eps == 1e-12
    assert "[training.dataloader]" in path.read_text()


def test_hf_assets_path_names_the_tokenizer_when_tokenizer_path_is_empty():
    folder = os.path.join(ROOT, "tests/assets/tokenizer")
    m = cfg_of(f"--model.hf_assets_path={folder}").model
    assert tokenizer_file(m) == os.path.join(folder, "tokenizer.json")
    assert load_model_tokenizer(m).path == os.path.join(folder, "tokenizer.json")
    both = cfg_of(f"--model.hf_assets_path={folder}", "--model.tokenizer_path=/x.json").model
    assert tokenizer_file(both) == "/x.json"
    assert tokenizer_file(cfg_of().model) == ""


def test_hf_assets_path_without_a_tokenizer_is_one_line(tmp_path):
    from torchtitan.training.model_args import run_model_args

    cfg = cfg_of(f"--model.hf_assets_path={tmp_path}")
    with pytest.raises(ConfigError) as e:  # the args the check gets (the flavor's, as check_model)
        check_tokenizer(cfg, run_model_args(cfg_of()))
    assert str(e.value) == (
        f"--model.hf_assets_path: '{tmp_path}/tokenizer.json' not found; give the folder that holds"
        " the model's tokenizer.json, or set --model.tokenizer_path, or leave both empty for the"
        " bundled tokenizer"
    )


# --------------------------------------------------------------------- the checks


@pytest.mark.parametrize(
    "args, check, message",
    [
        (
            ["--training.gc_freq=-1"],
            check_gc_and_schedule,
            "--training.gc_freq=-1: must be >= 0 (0: Python's own collection schedule)",
        ),
        (
            ["--lr_scheduler.total_steps=0"],
            check_gc_and_schedule,
            "--lr_scheduler.total_steps=0: must be >= 1, or auto (= training.steps)",
        ),
        (
            ["--profiling.profiler_active=0"],
            check_profiler_steps,
            "--profiling.profiler_active=0: must be >= 1",
        ),
        (
            [
                "--profiling.enable_profiling",
                "--profiling.profile_freq=4",
                "--profiling.profiler_active=2",
            ],
            check_profiler_steps,
            "--profiling.profiler_warmup=3 + profiler_active=2 exceed --profiling.profile_freq=4:"
            " a trace's warmup and recorded steps fit in one profile_freq block; raise"
            " profile_freq or lower the other two",
        ),
        (
            ["--validation.dataloader.num_workers=-2"],
            lambda c: check_validation_shape(c, 2048),
            "--validation.dataloader.num_workers=-2: must be >= 0 (0: read on the training thread)"
            " or auto",
        ),
        (
            ["--training.dataloader.prefetch_factor=0"],
            lambda c: check_validation_shape(c, 2048),
            "--training.dataloader.prefetch_factor=0: must be >= 1, or auto (torch's default, 2)",
        ),
        (
            ["--validation.enable", "--validation.seq_len=4096"],
            lambda c: check_validation_shape(c, 2048),
            "--validation.seq_len=4096 exceeds the model's max_seq_len 2048",
        ),
        (
            [
                "--validation.enable",
                "--validation.local_batch_size=2",
                "--parallelism.pipeline_parallel_degree=2",
            ],
            lambda c: check_validation_shape(c, 2048),
            "--validation.local_batch_size=2: differs from --training.local_batch_size=8, which"
            " --parallelism.pipeline_parallel_degree=2 fixes (its shapes are the training"
            " step's); set --validation.local_batch_size=auto",
        ),
        (
            ["--training.dtype=bfloat16"],
            lambda c: check_training_dtype(c, 2),
            "--training.dtype=bfloat16: this job shards its parameters with FSDP"
            " (--parallelism.data_parallel_shard_degree=2), which trains in bf16 by mixed"
            " precision instead: use --training.mixed_precision_param=bfloat16 (fp32 parameters,"
            " bf16 compute) and leave training.dtype float32",
        ),
    ],
)
def test_bad_values_are_one_line_naming_the_key(args, check, message):
    with pytest.raises(ConfigError) as e:
        check(cfg_of(*args))
    assert str(e.value) == message


def test_good_values_pass_the_checks():
    cfg = cfg_of(
        "--training.dtype=bfloat16",
        "--validation.enable",
        "--validation.seq_len=128",
        "--profiling.enable_profiling",
        "--profiling.profile_freq=4",
        "--profiling.profiler_active=1",
    )
    check_gc_and_schedule(cfg)
    check_profiler_steps(cfg)
    check_validation_shape(cfg, 2048)
    check_training_dtype(cfg, 1)
