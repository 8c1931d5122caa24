"""Upstream torchtitan v0.2.2's four example TOMLs (tests/upstream/, key for key upstream's
values) run here unchanged, from the repository root as upstream's do: `make test` puts each
through run_train.sh's pre-launch check on 2 ranks (torch-free: every key accepted, c4_test and
the tokenizer of model.hf_assets_path found and read); with --slow each trains 2 steps (only
the steps and the dump folder given)."""

import json
import os
import subprocess
import sys

import pytest
import run_tests

TOMLS = [
    "tests/upstream/base_config.toml",
    "tests/upstream/llama3_debug_model.toml",
    "tests/upstream/deepseek_v3_debug_model.toml",
    "tests/upstream/qwen3_moe_debug.toml",
]


@pytest.mark.parametrize("toml", TOMLS)
def test_upstream_toml_passes_the_check_unchanged(toml, repo_root, subprocess_env):
    proc = subprocess.run(
        [sys.executable, "-m", "torchtitan.checks", "--job.config_file", toml],
        cwd=repo_root,
        env={**subprocess_env, "NGPU": "2", "LOCAL_WORLD_SIZE": "2", "TORCHTITAN_PRINT_MODE": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "train"
    assert "error" not in proc.stderr and "warning" not in proc.stderr, proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("toml", TOMLS)
def test_upstream_toml_trains_unchanged(toml, repo_root, tmp_path):
    dump = tmp_path / "run"
    rc, _, log = run_tests.launch(
        2,
        [
            "--job.config_file",
            os.path.join(repo_root, toml),
            "--training.steps=2",
            f"--job.dump_folder={dump}",
        ],
        str(tmp_path / "ranks"),
    )
    assert rc == 0, log[-3000:]
    records = [json.loads(x) for x in (dump / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
