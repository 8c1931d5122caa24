"""Upstream torchtitan's integration suite as our own cases (upstream_cases.py, run by
upstream_suite.py on upstream's base TOML): the table holds upstream's 58 cases; the main ones
train here in `make test` (a resume continues from the checkpoint); every other case upstream
enables is in the slow set, where it must train or be refused before launch in one line,
never crash."""

import math
import os

import pytest
import upstream_cases as uc
import upstream_suite as us

from torchtitan.config.manager import parse_cli

CONFIG = us.DEFAULT_CONFIG
BY_ID = {uc.case_id(c): c for c in uc.CASES}


# --------------------------------------------------------------------------- the table


def test_the_table_holds_upstreams_58_cases():
    suites = [c.suite for c in uc.CASES]
    assert {s: suites.count(s) for s in uc.SOURCES} == {
        "features": 43,
        "models": 9,
        "h100": 5,
        "ft": 1,
    }
    assert len(BY_ID) == 58
    assert sorted(uc.case_id(c) for c in uc.CASES if c.disabled) == [
        "features/2d_asynctp_compile",
        "fsdp+tp+cp+compile+float8",
        "fsdp2_memory_estimation",
        "h100/2d_asynctp_compile",
    ]
    assert sum(len(c.runs) for c in uc.CASES) == 66  # 8 cases run twice
    assert {c.ngpu for c in uc.CASES} == {2, 4, 8}
    assert not [c.name for c in uc.CASES if c.fast and c.disabled]
    for case in uc.CASES:  # every string splits into --key[=value] overrides
        for run in case.runs:
            parse_cli(us.tokens(s.format(dump="d", steps=1) for s in run.overrides))


def test_run_args_append_the_small_settings(tmp_path):
    dump = str(tmp_path)
    args, appended = us.run_args(BY_ID["default"], 0, 2, dump)
    assert args == [
        "--profiling.enable_profiling",
        "--metrics.enable_tensorboard",
        "--training.seq_len=64",
        "--training.local_batch_size=2",
        "--training.steps=2",
        f"--job.dump_folder={dump}",
    ]
    assert appended == args[2:5]
    # a resume's own steps are scaled (20 of upstream's 10 -> 2 x 2); its batch is its own
    assert us.run_args(BY_ID["full_checkpoint"], 1, 2, dump)[1][-1] == "--training.steps=4"
    assert us.run_args(BY_ID["gradient_accumulation"], 0, 3, dump)[1] == [
        "--training.seq_len=64",
        "--training.steps=3",
    ]
    # upstream's CI path of the first run's last checkpoint, said for our folder and steps
    load = us.run_args(BY_ID["model_only_hf_checkpoint"], 1, 2, dump)[0]
    assert load[load.index("--checkpoint.initial_load_path") + 1] == f"{dump}/hf_checkpoint/step-2/"
    # upstream's TOML paths name our copies; ft's runner arguments come first
    h100 = us.run_args(BY_ID["simplefsdp_deepseekv3_auto_bucketing"], 0, 2, dump)[0]
    assert h100[:2] == ["--job.config_file", "tests/upstream/deepseek_v3_debug_model.toml"]
    assert os.path.isfile(os.path.join(us.ROOT, h100[1]))
    assert us.run_args(BY_ID["default_torchft"], 0, 2, dump)[0][:4] == list(uc.FT_ARGS)


def test_last_error_line():
    text = "x\nerror: --a.b: bad\nTraceback\n  File y\nValueError: no\n"
    assert us.last_error(text) == "error: --a.b: bad"
    assert us.last_error("a\nKeyError: 'k'\n  ") == "KeyError: 'k'"
    assert us.last_error("one\ntwo\n") == "two"


def test_markdown_table(tmp_path):
    results = [
        us.Result(BY_ID["pp_1f1b"], "trained", loss=7.95081, appended="--training.steps=2"),
        us.Result(BY_ID["ddp"], "refused", "error: --x|y: no (exit 2)"),
    ]
    text = us.table(results, CONFIG, 2)
    assert "Results: 1 trained, 1 refused of 2 cases." in text
    assert text.endswith(
        "| suite | case | ranks | result | final loss / refusal line | appended |\n"
        "|---|---|---|---|---|---|\n"
        "| features | pp_1f1b | 2 | trained | 7.9508 | --training.steps=2 |\n"
        "| features | ddp | 4 | refused | error: --x\\|y: no (exit 2) |  |\n"
    )


# --------------------------------------------------------------------------- runs


@pytest.fixture
def in_root(monkeypatch):
    monkeypatch.chdir(us.ROOT)  # upstream's relative paths: from the repository root


def _run(case, tmp_path):
    return us.run_case(case, CONFIG, 2, str(tmp_path), None)


def test_a_refused_case_reports_the_checks_line(tmp_path, in_root):
    case = uc.UpstreamCase(
        "features", "tp3", "-", (uc.Run(("--parallelism.tensor_parallel_degree 3",)),), 2
    )
    r = _run(case, tmp_path)
    assert (r.status, r.loss) == ("refused", None)
    assert r.detail.startswith("error: ") and r.detail.endswith(" (exit 2)")
    assert "tensor_parallel_degree" in r.detail and "\n" not in r.detail
    assert not os.path.exists(os.path.join(tmp_path, "tp3", "metrics.jsonl"))


FAST = [uc.case_id(c) for c in uc.CASES if c.fast]
SLOW = [uc.case_id(c) for c in uc.CASES if not c.fast and not c.disabled]


@pytest.mark.parametrize("name", FAST)
def test_main_cases_train(name, tmp_path, in_root):
    r = _run(BY_ID[name], tmp_path)
    assert r.status == "trained", r.detail
    assert math.isfinite(r.loss) and 4.0 < r.loss < 9.0  # the debug model's first steps
    losses = us.read_losses(os.path.join(tmp_path, name))
    last = us.run_steps(us.tokens(BY_ID[name].runs[-1].overrides), 2)
    assert len(losses) == last and losses[-1] == r.loss  # a resume continues: steps 3 and 4


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW)
def test_other_cases_train_or_are_refused_in_one_line(name, tmp_path, in_root):
    r = _run(BY_ID[name], tmp_path)
    assert r.status in ("trained", "planned", "refused", "not run"), r.detail
    if r.status == "refused":
        assert "error: " in r.detail and "\n" not in r.detail
