"""--help text, field documentation and the torch-free `python -m torchtitan.checks`."""

import dataclasses
import subprocess
import sys
import textwrap

import pytest

from torchtitan.config import build_config
from torchtitan.config import job_config as jc
from torchtitan.config.manager import field_docs, sections

from config_helpers import write_toml

SECTION_NAMES = [
    "job", "model", "training", "parallelism", "moe", "optimizer", "lr_scheduler",
    "activation_checkpoint", "compile", "checkpoint", "comm", "metrics",
]


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
    assert "  --metrics.peak_tflops (float|auto, default 'auto')" in capsys.readouterr().out


# --------------------------------------------------------------------------- the torch-free check


def _run_check(args, env, repo_root, ngpu=None):
    env = dict(env)
    if ngpu is not None:
        env["NGPU"] = str(ngpu)
    return subprocess.run(
        [sys.executable, "-m", "torchtitan.checks", *args],
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
        " make them multiply to 4 or set --parallelism.data_parallel_shard_degree=auto"
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
        from torchtitan.config import build_config
        from torchtitan.checks import check_job
        from torchtitan.checks import __main__ as check

        cfg, _ = build_config(["--job.config_file", {toml!r}, "--training.seq_len=64"])
        check_job(cfg, 1)
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
        "error: --model.flavor: unknown flavor '9B' of llama3; choose one of debugmodel, tiny, 1B, 3B, 8B, 70B, 405B",
        "error: --training.dataset: local dataset path './no.jsonl' does not exist; give an existing"
        " .json/.jsonl/.parquet/.txt/.csv/.arrow file or folder, 'pydoc', or an HF hub name",
    ]


