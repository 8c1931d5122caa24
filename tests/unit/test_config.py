"""Config loading: defaults, TOML, CLI overrides, precedence, validation and every error path."""

import dataclasses
import os
import subprocess
import sys
import textwrap

import pytest

from torchtitan.config import (
    ConfigError,
    JobConfig,
    build_config,
    load_config,
    load_config_or_exit,
    validate,
)
from torchtitan.config import job_config as jc
from torchtitan.config import manager
from torchtitan.config.manager import field_docs, field_types, parse_cli, sections
from torchtitan.config.validate import resolve_dp_shard
from torchtitan.components.tokenizer import BUNDLED_TOKENIZER

SECTION_NAMES = [
    "job", "model", "training", "parallelism", "optimizer", "lr_scheduler",
    "activation_checkpoint", "compile", "checkpoint", "metrics",
]
SECTIONS_LINE = "sections: " + ", ".join(SECTION_NAMES)


def config_error(argv, world_size=1) -> str:
    """The ConfigError message load_config raises for argv; it must be a single line."""
    with pytest.raises(ConfigError) as info:
        load_config(argv, world_size)
    msg = str(info.value)
    assert "\n" not in msg and "\r" not in msg, msg
    assert msg.strip() == msg and msg
    return msg


def write_toml(tmp_path, text: str, name: str = "job.toml") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def cfg_of(argv):
    cfg, warnings = build_config(argv)
    assert warnings == []
    return cfg


# --------------------------------------------------------------------------- defaults


def test_no_arguments_gives_the_dataclass_defaults():
    cfg, warnings = build_config([])
    assert warnings == []
    assert cfg == JobConfig()
    assert cfg.job.dump_folder == "./outputs"
    assert cfg.job.print_config is False
    assert cfg.model.name == "llama3"
    assert cfg.model.flavor == "debugmodel"
    assert cfg.model.tokenizer_path == ""
    assert cfg.training.steps == 10
    assert cfg.training.local_batch_size == 8
    assert cfg.training.global_batch_size == -1
    assert cfg.training.seq_len == 256
    assert cfg.training.device == "auto"
    assert cfg.training.dataset == "pydoc"
    assert cfg.parallelism.data_parallel_shard_degree == -1
    assert cfg.parallelism.tensor_parallel_degree == 1
    assert cfg.optimizer.lr == 8e-4
    assert cfg.lr_scheduler.warmup_steps == 2
    assert cfg.lr_scheduler.decay_type == "linear"
    assert cfg.activation_checkpoint.mode == "none"
    assert cfg.checkpoint.enable is False


def test_defaults_validate_on_one_and_on_eight_ranks():
    cfg, _ = load_config([], 1)
    assert cfg == JobConfig()
    cfg, _ = load_config([], 8)
    assert cfg.parallelism.data_parallel_shard_degree == -1  # resolved later, not rewritten


def test_sections_are_the_jobconfig_fields_in_order():
    assert list(sections()) == SECTION_NAMES
    assert sections()["training"] is jc.Training
    types = field_types(jc.Training)
    assert types["steps"] is int and types["max_norm"] is float and types["dataset"] is str
    assert types["deterministic"] is bool


# --------------------------------------------------------------------------- TOML


def test_toml_values_override_defaults_and_keep_the_rest(tmp_path):
    path = write_toml(tmp_path, """
        [job]
        description = "from toml"
        print_config = true

        [training]
        steps = 42
        seq_len = 64
        device = "cpu"
        max_norm = 0.5

        [optimizer]
        lr = 1

        [lr_scheduler]
        decay_type = "cosine"
        min_lr_factor = 0.1
    """)
    cfg = cfg_of(["--job.config_file", path])
    assert cfg.job.config_file == path
    assert cfg.job.description == "from toml"
    assert cfg.job.print_config is True
    assert cfg.training.steps == 42
    assert cfg.training.seq_len == 64
    assert cfg.training.device == "cpu"
    assert cfg.training.max_norm == 0.5
    # a TOML integer for a float field becomes a float
    assert cfg.optimizer.lr == 1.0 and type(cfg.optimizer.lr) is float
    assert cfg.lr_scheduler.decay_type == "cosine"
    assert cfg.lr_scheduler.min_lr_factor == 0.1
    # untouched keys keep their defaults
    assert cfg.training.local_batch_size == 8
    assert cfg.optimizer.beta2 == 0.95
    assert cfg.model == jc.Model()


def test_bundled_debug_toml_loads_and_validates(repo_root):
    import tomllib

    path = os.path.join(repo_root, "train_configs", "llama3_debug.toml")
    with open(path, "rb") as f:
        data = tomllib.load(f)
    cfg, warnings = load_config(["--job.config_file", path], 2)
    assert warnings == []
    assert cfg.job.config_file == path
    for section, table in data.items():
        for key, value in table.items():
            assert getattr(getattr(cfg, section), key) == value, f"{section}.{key}"


def test_cli_overrides_toml_wherever_it_appears(tmp_path):
    path = write_toml(tmp_path, """
        [training]
        steps = 42
        seq_len = 64
    """)
    cfg = cfg_of(["--training.steps=7", "--job.config_file", path])
    assert cfg.training.steps == 7  # CLI wins even when written before the config file
    assert cfg.training.seq_len == 64  # TOML wins over the default
    cfg = cfg_of([f"--job.config_file={path}", "--training.seq_len", "32"])
    assert (cfg.training.steps, cfg.training.seq_len) == (42, 32)


def test_cli_space_and_equals_forms_are_equivalent():
    a = cfg_of(["--training.steps=9", "--optimizer.lr=0.5", "--training.dataset=/x y/z.jsonl"])
    b = cfg_of(["--training.steps", "9", "--optimizer.lr", "0.5", "--training.dataset", "/x y/z.jsonl"])
    assert a == b
    assert a.training.steps == 9 and a.optimizer.lr == 0.5
    assert a.training.dataset == "/x y/z.jsonl"


def test_cli_value_may_contain_equals_and_start_with_a_single_dash():
    cfg = cfg_of(["--job.description=a=b", "--training.global_batch_size", "-1", "--training.seed", "-3"])
    assert cfg.job.description == "a=b"
    assert cfg.training.global_batch_size == -1
    assert cfg.training.seed == -3


def test_bare_flag_means_true():
    assert cfg_of(["--job.print_config"]).job.print_config is True
    cfg = cfg_of(["--job.print_config", "--compile.enable", "--training.steps=3"])
    assert cfg.job.print_config is True and cfg.compile.enable is True
    assert cfg.training.steps == 3


def test_last_cli_override_wins():
    assert cfg_of(["--training.steps=3", "--training.steps", "5"]).training.steps == 5


@pytest.mark.parametrize(
    "text, expected",
    [("true", True), ("TRUE", True), ("1", True), ("yes", True), ("On", True),
     ("false", False), ("False", False), ("0", False), ("no", False), ("off", False)],
)
def test_bool_spellings(text, expected):
    cfg = cfg_of([f"--metrics.enable_tensorboard={text}"])
    assert cfg.metrics.enable_tensorboard is expected


@pytest.mark.parametrize("text, expected", [("12", 12), ("-4", -4), ("0x10", 16), ("1_000", 1000)])
def test_int_spellings(text, expected):
    assert cfg_of([f"--training.steps={text}"]).training.steps == expected


@pytest.mark.parametrize("text, expected", [("3e-4", 3e-4), ("2", 2.0), ("-0.5", -0.5)])
def test_float_spellings(text, expected):
    cfg = cfg_of([f"--optimizer.eps={text}"])
    assert cfg.optimizer.eps == expected and type(cfg.optimizer.eps) is float


def test_list_values_from_cli_text_and_from_toml_arrays():
    convert = manager.convert
    assert convert("a.b", list[int], "1, 2,3,") == [1, 2, 3]
    assert convert("a.b", list[int], [4, "0x5"]) == [4, 5]
    assert convert("a.b", list[str], "layers.2,layers.4") == ["layers.2", "layers.4"]
    assert convert("a.b", list[str], "") == []
    with pytest.raises(ConfigError) as info:
        convert("a.b", list[int], 5)
    assert str(info.value) == "--a.b: expected a list (list[int]), got 5"
    with pytest.raises(ConfigError) as info:
        convert("a.b", list[int], "1,x")
    assert str(info.value) == "--a.b: expected an integer, got 'x'"


def test_parse_cli_pairs_and_help_flag():
    assert parse_cli(["--a.b=c", "--d.e", "f", "--g.h", "--i.j="]) == (
        [("a.b", "c"), ("d.e", "f"), ("g.h", "true"), ("i.j", "")],
        False,
    )
    assert parse_cli(["-h"]) == ([], True)
    assert parse_cli(["--x.y=1", "--help"]) == ([("x.y", "1")], True)


# --------------------------------------------------------------------------- parse errors


def test_unknown_section_with_suggestion():
    assert config_error(["--trainig.steps=3"]) == (
        "unknown config section 'trainig' in 'trainig.steps' (did you mean 'training'?); " + SECTIONS_LINE
    )


def test_unknown_section_without_close_match_lists_sections():
    msg = config_error(["--foo.bar=1"])
    assert msg == "unknown config section 'foo' in 'foo.bar'; " + SECTIONS_LINE
    assert "did you mean" not in msg


def test_unknown_key_names_the_close_key():
    assert config_error(["--parallelism.tensor_parallel_degre=2"]) == (
        "unknown config key 'parallelism.tensor_parallel_degre' (did you mean"
        " 'parallelism.tensor_parallel_degree'?); see --help for all keys"
    )


def test_unknown_key_suggests_a_key_of_another_section():
    # the tokenizer is configured under [model], not [training]
    assert config_error(["--training.tokenizer_path=x"]) == (
        "unknown config key 'training.tokenizer_path' (did you mean 'model.tokenizer_path'?);"
        " see --help for all keys"
    )


def test_unknown_key_without_close_match():
    assert config_error(["--job.qqq=3"]) == "unknown config key 'job.qqq'; see --help for all keys"


def test_key_of_another_section_is_suggested_exactly():
    assert config_error(["--job.steps=3"]) == (
        "unknown config key 'job.steps' (did you mean 'training.steps'?); see --help for all keys"
    )


def test_unknown_key_in_toml(tmp_path):
    path = write_toml(tmp_path, """
        [training]
        stepz = 3
    """)
    assert config_error(["--job.config_file", path]) == (
        "unknown config key 'training.stepz' (did you mean 'training.steps'?); see --help for all keys"
    )


@pytest.mark.parametrize(
    "arg, expected",
    [
        ("--training.steps=abc", "--training.steps: expected an integer, got 'abc'"),
        ("--training.steps=1.5", "--training.steps: expected an integer, got '1.5'"),
        ("--training.steps=", "--training.steps: expected an integer, got ''"),
        ("--training.max_norm=x", "--training.max_norm: expected a number, got 'x'"),
        ("--optimizer.lr=1e-3e", "--optimizer.lr: expected a number, got '1e-3e'"),
        ("--job.print_config=maybe", "--job.print_config: expected true or false, got 'maybe'"),
        ("--compile.enable=2", "--compile.enable: expected true or false, got '2'"),
    ],
)
def test_wrong_type_on_the_command_line(arg, expected):
    assert config_error([arg]) == expected


@pytest.mark.parametrize(
    "toml, expected",
    [
        ("[training]\nsteps = true\n", "--training.steps: expected an integer, got True"),
        ("[training]\nsteps = 1.5\n", "--training.steps: expected an integer, got 1.5"),
        ("[optimizer]\nlr = \"fast\"\n", "--optimizer.lr: expected a number, got 'fast'"),
        ("[optimizer]\nlr = false\n", "--optimizer.lr: expected a number, got False"),
        ("[job]\nprint_config = 1\n", "--job.print_config: expected true or false, got 1"),
        ("[job]\ndescription = [1, 2]\n", "--job.description: expected a string, got [1, 2]"),
        ("[training.dataset]\nname = \"x\"\n", "--training.dataset: expected a string, got {'name': 'x'}"),
        ("[lr_scheduler]\ndecay_type = \"exp\"\n",
         "--lr_scheduler.decay_type: invalid value 'exp'; choose one of 'linear', 'cosine'"),
    ],
)
def test_wrong_type_in_toml(tmp_path, toml, expected):
    path = tmp_path / "bad.toml"
    path.write_text(toml)
    assert config_error(["--job.config_file", str(path)]) == expected


def test_enum_outside_choices_lists_them():
    assert config_error(["--training.device=tpu"]) == (
        "--training.device: invalid value 'tpu'; choose one of 'auto', 'cpu', 'cuda' (did you mean 'cpu'?)"
    )
    assert config_error(["--training.device=cud"]) == (
        "--training.device: invalid value 'cud'; choose one of 'auto', 'cpu', 'cuda' (did you mean 'cuda'?)"
    )
    assert config_error(["--activation_checkpoint.mode=zzz"]) == (
        "--activation_checkpoint.mode: invalid value 'zzz'; choose one of 'none', 'full', 'selective'"
    )


def test_enum_values_are_case_sensitive():
    assert config_error(["--training.device=CPU"]).startswith(
        "--training.device: invalid value 'CPU'; choose one of 'auto', 'cpu', 'cuda'"
    )


def test_missing_toml_file(tmp_path):
    path = str(tmp_path / "nope.toml")
    assert config_error(["--job.config_file", path]) == f"--job.config_file: file '{path}' not found"


def test_toml_path_is_a_folder(tmp_path):
    assert config_error([f"--job.config_file={tmp_path}"]) == (
        f"--job.config_file: '{tmp_path}' is a folder, not a TOML file"
    )


def test_invalid_toml(tmp_path):
    path = write_toml(tmp_path, """
        [training]
        steps 3
    """)
    msg = config_error(["--job.config_file", path])
    assert msg.startswith(f"--job.config_file: '{path}' is not valid TOML: ")
    assert "line 3" in msg  # the decoder's position survives on the same line


def test_top_level_non_table_key_in_toml(tmp_path):
    path = write_toml(tmp_path, """
        steps = 3
        [training]
        seq_len = 64
    """)
    assert config_error(["--job.config_file", path]) == (
        f"{path}: top-level key 'steps' must be a [section] table"
    )


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["steps=3"], "unexpected argument 'steps=3': overrides look like --section.key=value"),
        (["-x"], "unexpected argument '-x': overrides look like --section.key=value"),
        (["--training.steps=3", "4"], "unexpected argument '4': overrides look like --section.key=value"),
        (["--training"], "config key 'training' (command line) must look like section.key"),
        (["--a.b.c=1"], "config key 'a.b.c' (command line) must look like section.key"),
    ],
)
def test_bad_positional_or_malformed_key(argv, expected):
    assert config_error(argv) == expected


def test_dotted_key_inside_a_toml_table_is_a_wrong_type(tmp_path):
    # a dotted key inside a table becomes a nested table, which is a wrong type for a str field
    path = write_toml(tmp_path, """
        [model]
        flavor.size = "8B"
    """)
    assert config_error(["--job.config_file", path]) == "--model.flavor: expected a string, got {'size': '8B'}"


# --------------------------------------------------------------------------- deprecations


def test_deprecated_key_is_renamed_mapped_and_warned(monkeypatch, capsys):
    monkeypatch.setitem(
        manager.DEPRECATED_KEYS, ("training", "device_type"), ("device", {"gpu": "cuda"}, "use training.device")
    )
    monkeypatch.setitem(
        manager.DEPRECATED_KEYS, ("training", "batch_size"), ("local_batch_size", None, "use local_batch_size")
    )
    cfg, warnings = build_config(["--training.device_type=gpu", "--training.batch_size=3"])
    assert cfg.training.device == "cuda"
    assert cfg.training.local_batch_size == 3
    assert warnings == [
        "'training.device_type' is deprecated: use training.device",
        "'training.batch_size' is deprecated: use local_batch_size",
    ]
    cfg = load_config_or_exit(["--training.batch_size=3"], 1)
    assert cfg.training.local_batch_size == 3
    assert capsys.readouterr().err == "warning: 'training.batch_size' is deprecated: use local_batch_size\n"
    load_config_or_exit(["--training.batch_size=3"], 1, quiet=True)
    assert capsys.readouterr().err == ""


def test_load_config_or_exit_prints_one_error_line_and_exits_2(capsys):
    with pytest.raises(SystemExit) as info:
        load_config_or_exit(["--training.steps=x"], 1)
    assert info.value.code == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err == "error: --training.steps: expected an integer, got 'x'\n"
    with pytest.raises(SystemExit) as info:
        load_config_or_exit(["--training.steps=x"], 1, quiet=True)
    assert info.value.code == 2
    assert capsys.readouterr().err == ""


# --------------------------------------------------------------------------- validate: parallelism


@pytest.mark.parametrize(
    "world, argv, expected",
    [
        (1, [], 1),
        (8, [], 8),
        (8, ["--parallelism.data_parallel_replicate_degree=2"], 4),
        (6, ["--parallelism.data_parallel_replicate_degree=3"], 2),
        (8, ["--parallelism.data_parallel_replicate_degree=2", "--parallelism.tensor_parallel_degree=2"], 2),
        (8, ["--parallelism.pipeline_parallel_degree=2", "--parallelism.tensor_parallel_degree=2"], 2),
        (8, ["--parallelism.data_parallel_shard_degree=4", "--parallelism.data_parallel_replicate_degree=2"], 4),
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
    argv = ["--parallelism.data_parallel_shard_degree=3", "--parallelism.data_parallel_replicate_degree=2"]
    assert config_error(argv, world_size=4) == (
        "parallel degrees multiply to 6 (replicate 2 x shard 3 x tp 1 x pp 1) but the world size is 4;"
        " make them multiply to 4 or set --parallelism.data_parallel_shard_degree=-1"
    )


@pytest.mark.parametrize(
    "arg, expected",
    [
        ("--parallelism.tensor_parallel_degree=0", "--parallelism.tensor_parallel_degree=0: must be >= 1"),
        ("--parallelism.data_parallel_replicate_degree=-1",
         "--parallelism.data_parallel_replicate_degree=-1: must be >= 1"),
        ("--parallelism.pipeline_parallel_degree=0", "--parallelism.pipeline_parallel_degree=0: must be >= 1"),
        ("--parallelism.expert_parallel_degree=0", "--parallelism.expert_parallel_degree=0: must be >= 1"),
        ("--parallelism.data_parallel_shard_degree=0",
         "--parallelism.data_parallel_shard_degree=0: must be >= 1 or -1 (the rest)"),
        ("--parallelism.data_parallel_shard_degree=-2",
         "--parallelism.data_parallel_shard_degree=-2: must be >= 1 or -1 (the rest)"),
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
    assert config_error(["--model.flavor=tiny", "--parallelism.tensor_parallel_degree=8"], world_size=8) == (
        "--parallelism.tensor_parallel_degree=8 does not divide llama3 tiny n_kv_heads=4; pick a divisor of 4"
    )


def test_expert_parallel_needs_experts():
    assert config_error(["--parallelism.expert_parallel_degree=2"], world_size=2) == (
        "--parallelism.expert_parallel_degree=2: model llama3 has no experts; set it to 1"
    )


# --------------------------------------------------------------------------- validate: training


def test_global_batch_size_must_be_a_multiple():
    base = ["--training.local_batch_size=4"]
    msg = "must be a positive multiple of local_batch_size x data-parallel degree = 4 x 2 = 8 (or -1)"
    for gbs in (12, 4, 0, -8):
        assert config_error(base + [f"--training.global_batch_size={gbs}"], world_size=2) == (
            f"--training.global_batch_size={gbs} {msg}"
        )
    for gbs in (-1, 8, 16, 32):
        cfg, _ = load_config(base + [f"--training.global_batch_size={gbs}"], 2)
        assert cfg.training.global_batch_size == gbs


def test_global_batch_size_counts_replicas_too():
    argv = ["--training.local_batch_size=2", "--parallelism.data_parallel_replicate_degree=2",
            "--training.global_batch_size=6"]
    assert config_error(argv, world_size=4) == (
        "--training.global_batch_size=6 must be a positive multiple of local_batch_size x data-parallel"
        " degree = 2 x 4 = 8 (or -1)"
    )


def test_unknown_model_flavor_with_suggestion():
    assert config_error(["--model.flavor=debugmodle"]) == (
        "--model.flavor: unknown flavor 'debugmodle' of llama3 (did you mean 'debugmodel'?);"
        " choose one of debugmodel, tiny, 8B, 70B, 405B"
    )
    assert config_error(["--model.flavor=9B"]) == (
        "--model.flavor: unknown flavor '9B' of llama3; choose one of debugmodel, tiny, 8B, 70B, 405B"
    )


def test_unknown_model_name():
    assert config_error(["--model.name=llama4"]) == (
        "--model.name: unknown model 'llama4' (did you mean 'llama3'?); choose one of llama3"
    )


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--training.steps=0"], "--training.steps=0: must be >= 1"),
        (["--training.local_batch_size=0"], "--training.local_batch_size=0: must be >= 1"),
        (["--training.seq_len=-5"], "--training.seq_len=-5: must be >= 1"),
        (["--model.flavor=tiny", "--training.seq_len=131073"],
         "--training.seq_len=131073 exceeds the model's max_seq_len 131072"),
        (["--training.max_norm=-1"], "--training.max_norm=-1.0: must be >= 0 (0 disables clipping)"),
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
        ["--training.max_norm=0", "--lr_scheduler.warmup_steps=0", "--lr_scheduler.decay_ratio=0",
         "--training.seq_len=1", "--training.steps=1"],
        1,
    )
    assert cfg.training.max_norm == 0.0 and cfg.lr_scheduler.decay_ratio == 0.0


@pytest.mark.parametrize(
    "option, expected",
    [
        ("abc", "--activation_checkpoint.selective_ac_option='abc': use 'op' or a positive integer n"
                " (checkpoint every n-th block)"),
        ("0", "--activation_checkpoint.selective_ac_option='0': use 'op' or a positive integer n"
              " (checkpoint every n-th block)"),
        ("-1", "--activation_checkpoint.selective_ac_option='-1': use 'op' or a positive integer n"
               " (checkpoint every n-th block)"),
        ("OP", "--activation_checkpoint.selective_ac_option='OP': use 'op' or a positive integer n"
               " (checkpoint every n-th block)"),
    ],
)
def test_selective_ac_option_invalid(option, expected):
    argv = ["--activation_checkpoint.mode=selective", f"--activation_checkpoint.selective_ac_option={option}"]
    assert config_error(argv) == expected


def test_selective_ac_option_valid_and_ignored_outside_selective_mode():
    for option in ("op", "1", "3"):
        cfg, _ = load_config(
            ["--activation_checkpoint.mode=selective", f"--activation_checkpoint.selective_ac_option={option}"], 1
        )
        assert cfg.activation_checkpoint.selective_ac_option == option
    cfg, _ = load_config(["--activation_checkpoint.mode=full", "--activation_checkpoint.selective_ac_option=abc"], 1)
    assert cfg.activation_checkpoint.mode == "full"


# --------------------------------------------------------------------------- validate: paths


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


@pytest.mark.parametrize("name", ["nope.jsonl", "data/train.parquet", "./nope_dir", "/definitely/not/here"])
def test_local_dataset_path_that_does_not_exist(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    assert config_error([f"--training.dataset={name}"]) == (
        f"--training.dataset: local dataset path '{name}' does not exist; give an existing"
        " .json/.jsonl/.parquet/.txt/.csv/.arrow file or folder, 'pydoc', or an HF hub name"
    )


def test_existing_local_dataset_and_hub_names_are_accepted(tmp_path, monkeypatch):
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "x"}\n')
    for name in (str(data), str(tmp_path), "pydoc", "allenai/c4", "HuggingFaceFW/fineweb-edu"):
        cfg, _ = load_config([f"--training.dataset={name}"], 1)
        assert cfg.training.dataset == name
    monkeypatch.chdir(tmp_path)
    load_config(["--training.dataset=d.jsonl"], 1)  # relative to the working folder


def test_dump_folder_that_is_a_file(tmp_path):
    path = tmp_path / "afile"
    path.write_text("x")
    assert config_error([f"--job.dump_folder={path}"]) == f"--job.dump_folder: '{path}' is a file; give a folder path"
    # a folder that does not exist yet is fine: the run creates it
    load_config([f"--job.dump_folder={tmp_path / 'new' / 'run'}"], 1)


def test_checkpoint_folder_that_is_a_file(tmp_path):
    (tmp_path / "ckpt").write_text("x")
    argv = [f"--job.dump_folder={tmp_path}", "--checkpoint.folder=ckpt"]
    load_config(argv, 1)  # checkpointing disabled: not checked
    assert config_error(["--checkpoint.enable"] + argv) == (
        f"--checkpoint.folder: '{os.path.join(str(tmp_path), 'ckpt')}' is a file; give a folder path"
    )


def test_validate_reports_the_first_problem_only():
    cfg = cfg_of(["--model.flavor=nope", "--training.steps=0"])
    with pytest.raises(ConfigError, match=r"^--model.flavor: unknown flavor 'nope'"):
        validate(cfg, 1)


# --------------------------------------------------------------------------- --help


def _all_fields():
    for name, cls in sections().items():
        for f in dataclasses.fields(cls):
            yield name, cls, f


def test_every_field_has_a_non_empty_doc():
    missing = [f"{name}.{f.name}" for name, cls, f in _all_fields() if not field_docs(cls).get(f.name, "").strip()]
    assert missing == []
    # field_docs joins multi-line docstrings into one line
    assert field_docs(jc.Model)["tokenizer_path"] == (
        "HF tokenizer.json file (or a folder holding one). Empty = the small BPE tokenizer"
        " bundled in torchtitan/assets (built by scripts/build_tokenizer.py)."
    )
    assert field_docs(jc.Compile)["enable"] == "Compile each transformer block with torch.compile."


@dataclasses.dataclass
class _PartlyDocumented:
    a: int = 1
    """Doc of a."""

    b: int = 2
    c: str = "x"
    """Doc of c,
    on two lines."""


def test_field_docs_skip_fields_without_a_docstring():
    assert field_docs(_PartlyDocumented) == {"a": "Doc of a.", "c": "Doc of c, on two lines."}


def test_help_prints_every_key_with_type_default_and_doc(capsys):
    with pytest.raises(SystemExit) as info:
        build_config(["--training.steps=3", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr()
    assert out.err == ""
    lines = out.out.splitlines()
    assert lines[0].startswith("usage: run_train.sh [--section.key=value ...]")
    for name, cls, f in _all_fields():
        head = [i for i, line in enumerate(lines) if line.startswith(f"  --{name}.{f.name} (")]
        assert len(head) == 1, f"{name}.{f.name} missing from --help"
        doc = field_docs(cls)[f.name]
        assert lines[head[0] + 1] == f"      {doc}"
    for name in SECTION_NAMES:
        assert f"[{name}]" in lines
    assert "  --training.steps (int, default 10)" in lines
    assert "  --training.device (auto|cpu|cuda, default 'auto')" in lines
    assert "  --optimizer.lr (float, default 0.0008)" in lines
    assert "  --job.print_config (bool, default False)" in lines


def test_help_short_flag(capsys):
    with pytest.raises(SystemExit) as info:
        build_config(["-h"])
    assert info.value.code == 0
    assert "  --metrics.peak_tflops (float, default 0.0)" in capsys.readouterr().out


# --------------------------------------------------------------------------- the torch-free check


def _run_check(args, env, repo_root, ngpu=None):
    env = dict(env)
    if ngpu is not None:
        env["NGPU"] = str(ngpu)
    return subprocess.run(
        [sys.executable, "-m", "torchtitan.config.check", *args],
        cwd=repo_root, env=env, capture_output=True, text=True, timeout=60,
    )


def test_check_module_bad_key_exits_2_with_one_error_line(subprocess_env, repo_root):
    proc = _run_check(["--parallelism.tensor_parallel_degre=2"], subprocess_env, repo_root)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr == (
        "error: unknown config key 'parallelism.tensor_parallel_degre' (did you mean"
        " 'parallelism.tensor_parallel_degree'?); see --help for all keys\n"
    )


def test_check_module_good_config_and_world_size_from_ngpu(subprocess_env, repo_root):
    proc = _run_check(["--training.steps=3"], subprocess_env, repo_root)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")
    proc = _run_check(["--parallelism.data_parallel_shard_degree=2"], subprocess_env, repo_root, ngpu=4)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "error: parallel degrees multiply to 2 (replicate 1 x shard 2 x tp 1 x pp 1) but the world size is 4;"
        " make them multiply to 4 or set --parallelism.data_parallel_shard_degree=-1"
    ]


def test_check_module_help_exits_0(subprocess_env, repo_root):
    proc = _run_check(["--help"], subprocess_env, repo_root)
    assert proc.returncode == 0
    assert "  --parallelism.tensor_parallel_degree (int, default 1)" in proc.stdout.splitlines()


def test_config_check_never_imports_torch(subprocess_env, repo_root, tmp_path):
    toml = write_toml(tmp_path, """
        [training]
        steps = 5
    """)
    script = textwrap.dedent(f"""
        import sys
        from torchtitan.config import build_config, validate, load_config
        from torchtitan.config import check

        cfg, _ = build_config(["--job.config_file", {toml!r}, "--training.seq_len=64"])
        validate(cfg, 1)
        assert cfg.training.steps == 5
        for argv in (["--training.stepz=1"], ["--model.flavor=9B"], ["--training.dataset=./no.jsonl"]):
            sys.argv = ["check", *argv]
            try:
                check.main()
            except SystemExit as e:
                assert e.code == 2, e.code
            else:
                raise AssertionError("no error for " + repr(argv))
        sys.argv = ["check", "--training.steps=2"]
        check.main()
        bad = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
        print("TORCH_MODULES", bad)
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=repo_root, env=subprocess_env,
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "TORCH_MODULES []"
    assert proc.stderr.splitlines() == [
        "error: unknown config key 'training.stepz' (did you mean 'training.steps'?); see --help for all keys",
        "error: --model.flavor: unknown flavor '9B' of llama3; choose one of debugmodel, tiny, 8B, 70B, 405B",
        "error: --training.dataset: local dataset path './no.jsonl' does not exist; give an existing"
        " .json/.jsonl/.parquet/.txt/.csv/.arrow file or folder, 'pydoc', or an HF hub name",
    ]


# --------------------------------------------------------------------------- known bugs


def test_last_config_file_on_the_command_line_is_the_one_loaded(tmp_path):
    default = write_toml(tmp_path, "[training]\nsteps = 111\n", "default.toml")
    mine = write_toml(tmp_path, "[training]\nsteps = 222\n", "mine.toml")
    # exactly what run_train.sh builds: `--job.config_file "$CONFIG_FILE" "$@"`
    cfg = cfg_of(["--job.config_file", default, f"--job.config_file={mine}"])
    assert cfg.job.config_file == mine
    assert cfg.training.steps == 222


def test_short_help_after_a_bare_flag_prints_help(capsys):
    with pytest.raises(SystemExit) as info:
        build_config(["--job.print_config", "-h"])
    assert info.value.code == 0
    assert "[training]" in capsys.readouterr().out


@pytest.mark.parametrize("arg", ["--optimizer.lr=nan", "--optimizer.lr=inf", "--training.max_norm=nan"])
def test_non_finite_floats_are_rejected(arg):
    config_error([arg])


@pytest.mark.parametrize(
    "wrong, right",
    [("training.warmup_steps", "lr_scheduler.warmup_steps"), ("optimizer.decay_type", "lr_scheduler.decay_type")],
)
def test_key_in_the_wrong_section_suggests_its_real_section(wrong, right):
    assert config_error([f"--{wrong}=1"]) == (
        f"unknown config key '{wrong}' (did you mean '{right}'?); see --help for all keys"
    )


def test_leading_zero_integer():
    assert cfg_of(["--training.seed=010"]).training.seed == 10
