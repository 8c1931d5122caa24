"""Config loading: defaults, TOML, CLI overrides, precedence, validation and every error path."""

import dataclasses
import os

import pytest
from config_helpers import cfg_of, config_error, write_toml  # noqa: E402

from torchtitan.checks import load_config, load_config_or_exit
from torchtitan.config import ConfigError, JobConfig, build_config, manager
from torchtitan.config import job_config as jc
from torchtitan.config.manager import field_types, parse_cli, section_of, sections

# Every section of a job: JobConfig's fields, in their order.
SECTION_NAMES = [f.name for f in dataclasses.fields(JobConfig)]
SECTIONS_LINE = "sections: " + ", ".join(SECTION_NAMES)


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
    assert cfg.training.global_batch_size == "auto"
    assert cfg.training.seq_len == 256
    assert cfg.training.device == "auto"
    assert cfg.training.dataset == "pydoc"
    assert cfg.parallelism.data_parallel_shard_degree == "auto"
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
    assert cfg.parallelism.data_parallel_shard_degree == "auto"  # resolved later, not rewritten


def test_sections_are_the_jobconfig_fields_in_order():
    top = [name for name in sections() if "." not in name]
    # "quantize" holds only sections of its own, so it has no keys and is not listed
    assert top == [name for name in SECTION_NAMES if name != "quantize"]
    assert sections()["training"] is jc.Training
    # each section's class is the type of the section a JobConfig holds
    cfg = JobConfig()
    assert all(type(section_of(cfg, name)) is cls for name, cls in sections().items())
    # nested tables follow their parent, named as TOML names them
    names = list(sections())
    assert names.index("training.dataloader") == names.index("training") + 1
    assert sections()["quantize.linear.float8"] is jc.Float8Linear
    types = field_types(jc.Training)
    assert types["steps"] is int and types["max_norm"] is float and types["dataset"] is str
    assert types["deterministic"] is bool


# --------------------------------------------------------------------------- TOML


def test_toml_values_override_defaults_and_keep_the_rest(tmp_path):
    path = write_toml(
        tmp_path,
        """
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
    """,
    )
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

    def check(obj, table: dict, where: str) -> None:
        for key, value in table.items():
            got = getattr(obj, key)
            if isinstance(value, dict):  # a nested table ([quantize.linear.float8])
                check(got, value, f"{where}.{key}")
            else:
                assert got == value, f"{where}.{key}"

    for section, table in data.items():
        check(getattr(cfg, section), table, section)


def test_cli_overrides_toml_wherever_it_appears(tmp_path):
    path = write_toml(
        tmp_path,
        """
        [training]
        steps = 42
        seq_len = 64
    """,
    )
    cfg = cfg_of(["--training.steps=7", "--job.config_file", path])
    assert cfg.training.steps == 7  # CLI wins even when written before the config file
    assert cfg.training.seq_len == 64  # TOML wins over the default
    cfg = cfg_of([f"--job.config_file={path}", "--training.seq_len", "32"])
    assert (cfg.training.steps, cfg.training.seq_len) == (42, 32)


def test_cli_space_and_equals_forms_are_equivalent():
    a = cfg_of(["--training.steps=9", "--optimizer.lr=0.5", "--training.dataset=/x y/z.jsonl"])
    b = cfg_of(
        ["--training.steps", "9", "--optimizer.lr", "0.5", "--training.dataset", "/x y/z.jsonl"]
    )
    assert a == b
    assert a.training.steps == 9 and a.optimizer.lr == 0.5
    assert a.training.dataset == "/x y/z.jsonl"


def test_cli_value_may_contain_equals_and_start_with_a_single_dash():
    cfg = cfg_of(
        ["--job.description=a=b", "--training.global_batch_size", "-1", "--training.seed", "-3"]
    )
    assert cfg.job.description == "a=b"
    assert cfg.training.global_batch_size == "auto"
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
    [
        ("true", True),
        ("TRUE", True),
        ("1", True),
        ("yes", True),
        ("On", True),
        ("false", False),
        ("False", False),
        ("0", False),
        ("no", False),
        ("off", False),
    ],
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
        "unknown config section 'trainig' in 'trainig.steps' (did you mean 'training'?); "
        + SECTIONS_LINE
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
    path = write_toml(
        tmp_path,
        """
        [training]
        stepz = 3
    """,
    )
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
        ('[optimizer]\nlr = "fast"\n', "--optimizer.lr: expected a number, got 'fast'"),
        ("[optimizer]\nlr = false\n", "--optimizer.lr: expected a number, got False"),
        ("[job]\nprint_config = 1\n", "--job.print_config: expected true or false, got 1"),
        ("[job]\ndescription = [1, 2]\n", "--job.description: expected a string, got [1, 2]"),
        (
            '[training.dataset]\nname = "x"\n',
            "--training.dataset: expected a string, got {'name': 'x'}",
        ),
        (
            '[lr_scheduler]\ndecay_type = "exp"\n',
            "--lr_scheduler.decay_type: invalid value 'exp'; choose one of 'linear', 'sqrt', 'cosine'",
        ),
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
        "--activation_checkpoint.mode: invalid value 'zzz'; choose one of 'none', 'full', 'selective', 'memory_budget'"
    )


def test_enum_values_are_case_sensitive():
    assert config_error(["--training.device=CPU"]).startswith(
        "--training.device: invalid value 'CPU'; choose one of 'auto', 'cpu', 'cuda'"
    )


def test_missing_toml_file(tmp_path):
    path = str(tmp_path / "nope.toml")
    assert (
        config_error(["--job.config_file", path]) == f"--job.config_file: file '{path}' not found"
    )


def test_toml_path_is_a_folder(tmp_path):
    assert config_error([f"--job.config_file={tmp_path}"]) == (
        f"--job.config_file: '{tmp_path}' is a folder, not a TOML file"
    )


def test_invalid_toml(tmp_path):
    path = write_toml(
        tmp_path,
        """
        [training]
        steps 3
    """,
    )
    msg = config_error(["--job.config_file", path])
    assert msg.startswith(f"--job.config_file: '{path}' is not valid TOML: ")
    assert "line 3" in msg  # the decoder's position survives on the same line


def test_top_level_non_table_key_in_toml(tmp_path):
    path = write_toml(
        tmp_path,
        """
        steps = 3
        [training]
        seq_len = 64
    """,
    )
    assert config_error(["--job.config_file", path]) == (
        f"{path}: top-level key 'steps' must be a [section] table"
    )


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["steps=3"], "unexpected argument 'steps=3': overrides look like --section.key=value"),
        (["-x"], "unexpected argument '-x': overrides look like --section.key=value"),
        (
            ["--training.steps=3", "4"],
            "unexpected argument '4': overrides look like --section.key=value",
        ),
        (["--training"], "config key 'training' (command line) must look like section.key"),
        (["--a.b.c=1"], "unknown config section 'a' in 'a.b.c'; " + SECTIONS_LINE),
    ],
)
def test_bad_positional_or_malformed_key(argv, expected):
    assert config_error(argv) == expected


def test_dotted_key_inside_a_toml_table_is_a_wrong_type(tmp_path):
    # a dotted key inside a table becomes a nested table, which is a wrong type for a str field
    path = write_toml(
        tmp_path,
        """
        [model]
        flavor.size = "8B"
    """,
    )
    assert (
        config_error(["--job.config_file", path])
        == "--model.flavor: expected a string, got {'size': '8B'}"
    )


# --------------------------------------------------------------------------- deprecations


def test_deprecated_key_is_renamed_mapped_and_warned(monkeypatch, capsys):
    monkeypatch.setitem(
        manager.DEPRECATED_KEYS,
        ("training", "device_type"),
        ("device", {"gpu": "cuda"}, "use training.device"),
    )
    monkeypatch.setitem(
        manager.DEPRECATED_KEYS,
        ("training", "batch_size"),
        ("local_batch_size", None, "use local_batch_size"),
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
    assert (
        capsys.readouterr().err
        == "warning: 'training.batch_size' is deprecated: use local_batch_size\n"
    )
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


@pytest.mark.parametrize(
    "arg", ["--optimizer.lr=nan", "--optimizer.lr=inf", "--training.max_norm=nan"]
)
def test_non_finite_floats_are_rejected(arg):
    config_error([arg])


@pytest.mark.parametrize(
    "wrong, right",
    [
        ("training.warmup_steps", "lr_scheduler.warmup_steps"),
        ("optimizer.decay_type", "lr_scheduler.decay_type"),
    ],
)
def test_key_in_the_wrong_section_suggests_its_real_section(wrong, right):
    assert config_error([f"--{wrong}=1"]) == (
        f"unknown config key '{wrong}' (did you mean '{right}'?); see --help for all keys"
    )


def test_leading_zero_integer():
    assert cfg_of(["--training.seed=010"]).training.seed == 10
