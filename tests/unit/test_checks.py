"""The pre-launch checks (torchtitan/checks/), which need no process group: degrees, shapes,
batch sizes, paths."""

import os

import pytest
from config_helpers import cfg_of, config_error

from torchtitan.checks import check_job, load_config
from torchtitan.checks.layout import resolve_dp_shard
from torchtitan.config import ConfigError
from torchtitan.data.tokenizer import BUNDLED_TOKENIZER
from torchtitan.models.flavors import flavors_of
from torchtitan.models.registry import MODELS

LLAMA3_FLAVORS = ", ".join(flavors_of("llama3"))  # every flavor, in the registry's order
MODEL_NAMES = ", ".join(MODELS)  # every registered model


# --------------------------------------------------------------------------- checks: parallelism


@pytest.mark.parametrize(
    "world, argv, expected",
    [
        (1, [], 1),
        (8, [], 8),
        (8, ["--parallelism.data_parallel_replicate_degree=2"], 4),
        (6, ["--parallelism.data_parallel_replicate_degree=3"], 2),
        (
            8,
            [
                "--parallelism.data_parallel_replicate_degree=2",
                "--parallelism.tensor_parallel_degree=2",
            ],
            2,
        ),
        (
            8,
            ["--parallelism.pipeline_parallel_degree=2", "--parallelism.tensor_parallel_degree=2"],
            2,
        ),
        (
            8,
            [
                "--parallelism.data_parallel_shard_degree=4",
                "--parallelism.data_parallel_replicate_degree=2",
            ],
            4,
        ),
        # EP borrows its ranks from data parallelism: it does not reduce the shard degree
        (4, ["--parallelism.expert_parallel_degree=2"], 4),
    ],
)
def test_resolve_dp_shard(world, argv, expected):
    assert resolve_dp_shard(cfg_of(argv), world) == expected


def test_world_not_divisible_by_the_other_degrees():
    assert config_error(["--parallelism.data_parallel_replicate_degree=2"], world_size=3) == (
        "world size 3 is not divisible by data_parallel_replicate_degree x tensor_parallel_degree x"
        " pipeline_parallel_degree = 2; change the degrees or NGPU"
    )


def test_degrees_not_multiplying_to_world_size():
    argv = [
        "--parallelism.data_parallel_shard_degree=3",
        "--parallelism.data_parallel_replicate_degree=2",
    ]
    assert config_error(argv, world_size=4) == (
        "parallel degrees multiply to 6 (replicate 2 x shard 3 x tp 1 x pp 1) but the world size is 4;"
        " make them multiply to 4 or set --parallelism.data_parallel_shard_degree=auto"
    )


@pytest.mark.parametrize(
    "arg, expected",
    [
        (
            "--parallelism.tensor_parallel_degree=0",
            "--parallelism.tensor_parallel_degree=0: must be >= 1",
        ),
        (
            "--parallelism.data_parallel_replicate_degree=-1",
            "--parallelism.data_parallel_replicate_degree=-1: must be >= 1",
        ),
        (
            "--parallelism.pipeline_parallel_degree=0",
            "--parallelism.pipeline_parallel_degree=0: must be >= 1",
        ),
        (
            "--parallelism.expert_parallel_degree=0",
            "--parallelism.expert_parallel_degree=0: must be >= 1",
        ),
        (
            "--parallelism.data_parallel_shard_degree=0",
            "--parallelism.data_parallel_shard_degree=0: must be >= 1 or auto (the rest)",
        ),
        (
            "--parallelism.data_parallel_shard_degree=-2",
            "--parallelism.data_parallel_shard_degree=-2: must be >= 1 or auto (the rest)",
        ),
    ],
)
def test_degrees_below_one(arg, expected):
    assert config_error([arg], world_size=4) == expected


def test_tp_degree_must_divide_the_heads():
    assert config_error(["--parallelism.tensor_parallel_degree=3"], world_size=6) == (
        "--parallelism.tensor_parallel_degree=3 does not divide llama3 debugmodel n_heads=16;"
        " pick a divisor of 16"
    )


def test_tp_degree_must_divide_the_kv_heads():
    # tiny: 8 query heads, 4 KV heads; 8 divides the first only
    assert config_error(
        ["--model.flavor=tiny", "--parallelism.tensor_parallel_degree=8"], world_size=8
    ) == (
        "--parallelism.tensor_parallel_degree=8 does not divide llama3 tiny n_kv_heads=4; pick a divisor of 4"
    )


@pytest.mark.parametrize("schedule", ["InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"])
def test_compile_with_a_zero_bubble_schedule_is_refused(schedule):
    # torch 2.13 raises when such a schedule is built on compiled stages: refused before launch
    argv = [
        "--parallelism.pipeline_parallel_degree=2",
        f"--parallelism.pipeline_parallel_schedule={schedule}",
        "--model.flavor=tiny",
        "--training.local_batch_size=8",
        "--compile.enable=true",
    ]
    assert config_error(argv, world_size=2) == (
        f"--compile.enable=true with --parallelism.pipeline_parallel_schedule={schedule}: torch's zero-bubble"
        " schedules (InterleavedZeroBubble, ZBVZeroBubble, DualPipeV, PipelineScheduleMulti) refuse compiled stages (they split each"
        " backward into input and weight passes); use 1F1B, Interleaved1F1B, GPipe or LoopedBFS, or"
        " --compile.enable=false"
    )
    load_config(argv[:-1], 2)  # the same schedule eager: accepted
    load_config(
        [*argv[:1], "--parallelism.pipeline_parallel_schedule=1F1B", *argv[2:]], 2
    )  # compiled 1F1B too


def test_expert_parallel_needs_experts():
    assert config_error(["--parallelism.expert_parallel_degree=2"], world_size=2) == (
        "--parallelism.expert_parallel_degree=2: model llama3 has no experts; set it to 1"
    )


# --------------------------------------------------------------------------- checks: training


def test_global_batch_size_must_be_a_multiple():
    base = ["--training.local_batch_size=4"]
    msg = "must be a positive multiple of local_batch_size x data-parallel degree = 4 x 2 = 8 (or auto)"
    for gbs in (12, 4, 0, -8):
        assert config_error(base + [f"--training.global_batch_size={gbs}"], world_size=2) == (
            f"--training.global_batch_size={gbs} {msg}"
        )
    for gbs in ("auto", -1, 8, 16, 32):  # -1: torchtitan's own spelling of auto, accepted as it
        cfg, _ = load_config(base + [f"--training.global_batch_size={gbs}"], 2)
        assert cfg.training.global_batch_size == ("auto" if gbs == -1 else gbs)


def test_global_batch_size_counts_replicas_too():
    argv = [
        "--training.local_batch_size=2",
        "--parallelism.data_parallel_replicate_degree=2",
        "--training.global_batch_size=6",
    ]
    assert config_error(argv, world_size=4) == (
        "--training.global_batch_size=6 must be a positive multiple of local_batch_size x data-parallel"
        " degree = 2 x 4 = 8 (or auto)"
    )


def test_unknown_model_flavor_with_suggestion():
    assert config_error(["--model.flavor=debugmodle"]) == (
        "--model.flavor: unknown flavor 'debugmodle' of llama3 (did you mean 'debugmodel'?);"
        f" choose one of {LLAMA3_FLAVORS}"
    )
    assert config_error(["--model.flavor=9B"]) == (
        f"--model.flavor: unknown flavor '9B' of llama3; choose one of {LLAMA3_FLAVORS}"
    )


def test_unknown_model_name():
    assert config_error(["--model.name=llama5"]) == (
        f"--model.name: unknown model 'llama5' (did you mean 'llama3'?); choose one of {MODEL_NAMES}"
    )


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--training.steps=0"], "--training.steps=0: must be >= 1"),
        (["--training.local_batch_size=0"], "--training.local_batch_size=0: must be >= 1"),
        (["--training.seq_len=-5"], "--training.seq_len=-5: must be >= 1"),
        (
            ["--model.flavor=tiny", "--training.seq_len=131073"],
            "--training.seq_len=131073 exceeds the model's max_seq_len 131072",
        ),
        (
            ["--training.max_norm=-1"],
            "--training.max_norm=-1.0: must be >= 0 (0 disables clipping)",
        ),
        (["--optimizer.lr=0"], "--optimizer.lr=0.0: must be > 0"),
        (["--lr_scheduler.warmup_steps=-1"], "--lr_scheduler.warmup_steps=-1: must be >= 0"),
        (["--lr_scheduler.decay_ratio=1.5"], "--lr_scheduler.decay_ratio=1.5: must be in [0, 1]"),
        (["--lr_scheduler.decay_ratio=-0.1"], "--lr_scheduler.decay_ratio=-0.1: must be in [0, 1]"),
        (["--metrics.log_freq=0"], "--metrics.log_freq=0: must be >= 1"),
        (["--checkpoint.interval=0"], "--checkpoint.interval=0: must be >= 1"),
    ],
)
def test_value_ranges(argv, expected):
    assert config_error(argv) == expected


def test_boundary_values_are_accepted():
    cfg, _ = load_config(
        [
            "--training.max_norm=0",
            "--lr_scheduler.warmup_steps=0",
            "--lr_scheduler.decay_ratio=0",
            "--training.seq_len=1",
            "--training.steps=1",
        ],
        1,
    )
    assert cfg.training.max_norm == 0.0 and cfg.lr_scheduler.decay_ratio == 0.0


@pytest.mark.parametrize(
    "option, expected",
    [
        (
            "abc",
            "--activation_checkpoint.selective_ac_option='abc': use 'op' or a positive integer n"
            " (checkpoint every n-th block)",
        ),
        (
            "0",
            "--activation_checkpoint.selective_ac_option='0': use 'op' or a positive integer n"
            " (checkpoint every n-th block)",
        ),
        (
            "-1",
            "--activation_checkpoint.selective_ac_option='-1': use 'op' or a positive integer n"
            " (checkpoint every n-th block)",
        ),
        (
            "OP",
            "--activation_checkpoint.selective_ac_option='OP': use 'op' or a positive integer n"
            " (checkpoint every n-th block)",
        ),
    ],
)
def test_selective_ac_option_invalid(option, expected):
    argv = [
        "--activation_checkpoint.mode=selective",
        f"--activation_checkpoint.selective_ac_option={option}",
    ]
    assert config_error(argv) == expected


def test_selective_ac_option_valid_and_ignored_outside_selective_mode():
    for option in ("op", "1", "3"):
        cfg, _ = load_config(
            [
                "--activation_checkpoint.mode=selective",
                f"--activation_checkpoint.selective_ac_option={option}",
            ],
            1,
        )
        assert cfg.activation_checkpoint.selective_ac_option == option
    cfg, _ = load_config(
        ["--activation_checkpoint.mode=full", "--activation_checkpoint.selective_ac_option=abc"], 1
    )
    assert cfg.activation_checkpoint.mode == "full"


# --------------------------------------------------------------------------- checks: paths


def test_missing_tokenizer_file(tmp_path):
    path = str(tmp_path / "missing.json")
    assert config_error([f"--model.tokenizer_path={path}"]) == (
        f"--model.tokenizer_path: '{path}' not found; give an HF tokenizer.json file (or its folder),"
        " or leave it empty for the bundled tokenizer"
    )


def test_tokenizer_folder_without_tokenizer_json(tmp_path):
    expected_path = os.path.join(str(tmp_path), "tokenizer.json")
    assert config_error([f"--model.tokenizer_path={tmp_path}"]) == (
        f"--model.tokenizer_path: '{expected_path}' not found; give an HF tokenizer.json file (or its folder),"
        " or leave it empty for the bundled tokenizer"
    )


def test_existing_tokenizer_file_and_folder_are_accepted():
    load_config([f"--model.tokenizer_path={BUNDLED_TOKENIZER}"], 1)
    load_config([f"--model.tokenizer_path={os.path.dirname(BUNDLED_TOKENIZER)}"], 1)


@pytest.mark.parametrize(
    "name", ["nope.jsonl", "data/train.parquet", "./nope_dir", "/definitely/not/here"]
)
def test_local_dataset_path_that_does_not_exist(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    assert config_error([f"--training.dataset={name}"]) == (
        f"--training.dataset: local dataset path '{name}' does not exist; give an existing"
        " .json/.jsonl/.parquet/.txt/.csv/.arrow file or folder, 'pydoc', or an HF hub name"
    )


def test_existing_local_dataset_and_hub_names_are_accepted(tmp_path, monkeypatch):
    from torchtitan.data.kinds import dataset_kind

    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "x"}\n' * 8)  # a global batch of rows: local_batch_size 8 on one rank
    monkeypatch.setattr(
        dataset_kind("hub"), "check", lambda *a: None
    )  # no network here; test_check_data_hub.py covers it
    for name in (str(data), str(tmp_path), "pydoc", "allenai/c4", "HuggingFaceFW/fineweb-edu"):
        cfg, _ = load_config([f"--training.dataset={name}"], 1)
        assert cfg.training.dataset == name
    monkeypatch.chdir(tmp_path)
    load_config(["--training.dataset=d.jsonl"], 1)  # relative to the working folder


def test_dump_folder_that_is_a_file(tmp_path):
    path = tmp_path / "afile"
    path.write_text("x")
    assert (
        config_error([f"--job.dump_folder={path}"])
        == f"--job.dump_folder: '{path}' is a file; give a folder path"
    )
    # a folder that does not exist yet is fine: the run creates it
    load_config([f"--job.dump_folder={tmp_path / 'new' / 'run'}"], 1)


def test_checkpoint_folder_that_is_a_file(tmp_path):
    (tmp_path / "ckpt").write_text("x")
    argv = [f"--job.dump_folder={tmp_path}", "--checkpoint.folder=ckpt"]
    load_config(argv, 1)  # checkpointing disabled: not checked
    assert config_error(["--checkpoint.enable"] + argv) == (
        f"--checkpoint.folder: '{os.path.join(str(tmp_path), 'ckpt')}' is a file; give a folder path"
    )


def test_check_job_reports_the_first_problem_only():
    cfg = cfg_of(["--model.flavor=nope", "--training.steps=0"])
    with pytest.raises(ConfigError, match=r"^--model.flavor: unknown flavor 'nope'"):
        check_job(cfg, 1)


# --------------------------------------------------------------------------- checks: W&B

WANDB_ON = ["--metrics.enable_wandb=true"]
NOT_INSTALLED = (
    "--metrics.enable_wandb: the wandb package is not installed; pip install -e '.[wandb]'"
)


def _not_logged_in(host="api.wandb.ai"):
    return (
        f"--metrics.enable_wandb: not logged in to W&B ({host}): no WANDB_API_KEY and no netrc entry;"
        " run `wandb login`, set WANDB_API_KEY, or set WANDB_MODE=offline"
    )


@pytest.fixture
def wandb_env(monkeypatch, tmp_path):
    """wandb importable (a stand-in module), online, no credentials anywhere; returns the netrc path."""
    import importlib.machinery
    import sys
    import types

    fake = types.ModuleType("wandb")
    fake.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    for var in (
        "WANDB_MODE",
        "WANDB_DISABLED",
        "WANDB_API_KEY",
        "WANDB_IDENTITY_TOKEN_FILE",
        "WANDB_BASE_URL",
    ):
        monkeypatch.delenv(var, raising=False)
    netrc = tmp_path / "netrc"
    monkeypatch.setenv("NETRC", str(netrc))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc either
    return netrc


def test_wandb_off_is_not_checked(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    load_config([], 1)


def test_wandb_package_missing(monkeypatch, wandb_env):
    import sys

    monkeypatch.setitem(
        sys.modules, "wandb", None
    )  # importlib.util.find_spec then says "not there"
    assert config_error(WANDB_ON) == NOT_INSTALLED
    monkeypatch.setenv("WANDB_MODE", "offline")  # missing whatever the mode
    assert config_error(WANDB_ON) == NOT_INSTALLED


def test_wandb_package_missing_found_by_find_spec(monkeypatch, wandb_env):
    import importlib.util
    import sys

    monkeypatch.delitem(sys.modules, "wandb")
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    assert config_error(WANDB_ON) == NOT_INSTALLED


def test_wandb_online_without_login(wandb_env):
    assert config_error(WANDB_ON) == _not_logged_in()
    wandb_env.write_text("machine example.com login user password secret\n")  # another host's entry
    assert config_error(WANDB_ON) == _not_logged_in()
    wandb_env.write_text(
        "machine api.wandb.ai login user password\n"
    )  # no key: wandb finds none either
    assert config_error(WANDB_ON) == _not_logged_in()


def test_wandb_online_without_login_on_own_server(monkeypatch, wandb_env):
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.com")
    wandb_env.write_text(
        "machine api.wandb.ai login user password k\n"
    )  # the key of another server
    assert config_error(WANDB_ON) == _not_logged_in("wandb.example.com")
    wandb_env.write_text("machine wandb.example.com login user password k\n")
    load_config(WANDB_ON, 1)


@pytest.mark.parametrize(
    "setup", ["api_key", "netrc", "home_netrc", "offline", "dryrun", "disabled", "wandb_disabled"]
)
def test_wandb_logged_in_or_not_online(monkeypatch, tmp_path, wandb_env, setup):
    if setup == "api_key":
        monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    elif setup == "netrc":
        wandb_env.write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    elif setup == "home_netrc":
        monkeypatch.delenv("NETRC")
        (tmp_path / "home").mkdir()
        (tmp_path / "home" / ".netrc").write_text("machine api.wandb.ai login user password k\n")
    elif setup == "wandb_disabled":
        monkeypatch.setenv("WANDB_DISABLED", "true")
    else:
        monkeypatch.setenv("WANDB_MODE", setup)
    cfg, _ = load_config(WANDB_ON, 1)
    assert cfg.metrics.enable_wandb


def test_a_model_module_that_fails_while_importing_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "broken_models.py").write_text("def register(:\n")
    (tmp_path / "clashing_models.py").write_text(
        "from torchtitan.models.registry import ModelEntry, register\nregister('llama3', ModelEntry({}, 'elsewhere'))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert config_error(["--model.module=broken_models"]) == (
        "--model.module='broken_models': cannot import it (SyntaxError: invalid syntax (broken_models.py, line 1));"
        " give a module that registers a model, importable from PYTHONPATH"
    )
    assert config_error(["--model.module=clashing_models"]) == (
        "--model.module='clashing_models': cannot import it (ValueError: model 'llama3' is already registered"
        " (package torchtitan.models.llama3)); give a module that registers a model, importable from PYTHONPATH"
    )
