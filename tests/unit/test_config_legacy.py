"""One spelling per idea: "auto" derives a value in every key that can, and the older spellings
still mean what they meant (config/manager.py LEGACY_VALUES): silently where they are
torchtitan's own (-1 for data_parallel_shard_degree, global_batch_size, load_step), with one
deprecation line otherwise; on the command line and in TOML alike."""

import pytest
from config_helpers import write_toml

from torchtitan.checks import load_config
from torchtitan.config import build_config
from torchtitan.config.job_config import AUTO
from torchtitan.config.manager import LEGACY_VALUES

DS = [
    "--job.config_file=train_configs/deepseek_v3_debug.toml"
]  # a model with experts, for the [moe] keys

CASES = [
    (section, key, old, new, note)
    for (section, key), values in LEGACY_VALUES.items()
    for old, (new, note) in values.items()
]


@pytest.mark.parametrize(
    "section, key, old, new, note", CASES, ids=[f"{c[0]}.{c[1]}={c[2]}" for c in CASES]
)
def test_an_old_value_means_the_new_one(section, key, old, new, note, monkeypatch, repo_root):
    monkeypatch.chdir(repo_root)
    cfg, warnings = build_config([*DS, f"--{section}.{key}={old}"])
    assert getattr(getattr(cfg, section), key) == new
    shown = f'"{old}"' if isinstance(old, str) else old  # as TOML spells it
    expected = (
        []
        if note is None
        else [f"'{section}.{key} = {shown}' is deprecated: write {new!r} ({note})"]
    )
    assert warnings == expected
    # the whole check takes it as the new value
    cfg, warnings = load_config([*DS, f"--{section}.{key}={old}"], 2)
    assert getattr(getattr(cfg, section), key) == new and warnings == expected


def test_toml_numbers_are_old_values_too(tmp_path):
    path = write_toml(
        tmp_path,
        """
        [parallelism]
        data_parallel_shard_degree = -1
        [planning]
        memory_budget_gib = -1
        [training]
        global_batch_size = -1
    """,
    )
    cfg, warnings = build_config(["--job.config_file", path])
    assert (
        cfg.parallelism.data_parallel_shard_degree,
        cfg.planning.memory_budget_gib,
        cfg.training.global_batch_size,
    ) == (AUTO, "none", AUTO)
    assert warnings == ["'planning.memory_budget_gib = -1' is deprecated: write 'none' (no budget)"]


def test_the_new_spellings_and_numbers_need_no_warning():
    argv = [
        "--training.global_batch_size=auto",
        "--planning.memory_budget_gib=none",
        "--comm.hang_timeout_seconds=0",
        "--checkpoint.load_step=auto",
        "--hardware.peak_tflops=312",
        "--parallelism.data_parallel_shard_degree=1",
    ]
    cfg, warnings = build_config(argv)
    assert warnings == []
    assert (
        cfg.training.global_batch_size,
        cfg.planning.memory_budget_gib,
        cfg.comm.hang_timeout_seconds,
        cfg.checkpoint.load_step,
        cfg.hardware.peak_tflops,
    ) == (AUTO, "none", 0, AUTO, 312.0)


@pytest.mark.parametrize(
    "old, new, value, expected",
    [
        ("job.fit", "planning.fit", "layout", "layout"),
        ("job.layout_candidates", "planning.layout_candidates", "3", 3),
        ("job.layout_seconds", "planning.layout_seconds", "60", 60.0),
        ("job.nearby", "planning.nearby", "false", False),
        ("job.allow_over_budget", "planning.allow_over_budget", "true", True),
        ("parallelism.memory_budget_gib", "planning.memory_budget_gib", "4", 4.0),
        ("parallelism.memory_budget_gib", "planning.memory_budget_gib", "-1", "none"),
        ("moe.memory_skew", "planning.memory_skew", "2", 2.0),
        ("metrics.peak_tflops", "hardware.peak_tflops", "312", 312.0),
    ],
)
def test_the_planning_keys_old_spellings_work_with_one_warning(old, new, value, expected):
    cfg, warnings = build_config([f"--{old}={value}"])
    section, key = new.split(".")
    assert getattr(getattr(cfg, section), key) == expected
    assert warnings[0].startswith(f"'{old}' is deprecated: use '{new}'")
    assert len(warnings) == (2 if value == "-1" else 1)  # -1 also names its new spelling


def test_every_key_that_derives_defaults_to_auto():
    cfg, _ = build_config([])
    derived = {(s, k) for (s, k) in LEGACY_VALUES} | {
        ("training", "mixed_precision_param"),
        ("training", "device"),
        ("parallelism", "reshard_after_forward"),
        ("activation_checkpoint", "fsdp_ac_policy"),
    }
    for section, key in derived:
        assert getattr(getattr(cfg, section), key) == AUTO, (section, key)


def test_a_word_that_is_no_spelling_names_the_choices():
    with pytest.raises(Exception) as info:
        build_config(["--training.global_batch_size=all"])
    assert (
        str(info.value) == "--training.global_batch_size: expected 'auto' or an integer, got 'all'"
    )
