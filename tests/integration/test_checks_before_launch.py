"""The pre-launch checks where they run in a process of their own or start one: torch-free
(the check and the modules it reads import no torch), `python -m torchtitan.checks` (exit
codes, one-line errors, --help), run_train.sh's refusal of a job over its memory budget in
seconds (no worker starts), a real hub lookup offline (the hub libraries read HF_HUB_OFFLINE
when imported), and the budget's nvidia-smi read (a stand-in nvidia-smi). The same checks in
process: tests/unit/test_checks.py, test_check_data.py, test_model_states.py."""

import os
import stat
import subprocess
import sys
import textwrap
import time

from check_data_helpers import ROOT, docs, write_jsonl
from config_helpers import write_toml

from torchtitan.planning.memory import budget as memory_budget

V3_DEBUG = "train_configs/deepseek_v3_debug.toml"


# --------------------------------------------------------------------------- the check imports no torch


def test_config_check_never_imports_torch(subprocess_env, repo_root, tmp_path):
    toml = write_toml(
        tmp_path,
        """
        [training]
        steps = 5
    """,
    )
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
        [sys.executable, "-c", script],
        cwd=repo_root,
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "TORCH_MODULES []"
    assert proc.stderr.splitlines() == [
        "error: unknown config key 'training.stepz' (did you mean 'training.steps'?); see --help for all keys",
        "error: --model.flavor: unknown flavor '9B' of llama3; choose one of debugmodel, debugmodel_flex_attn, debugmodel_varlen_attn, tiny, 1B, 3B, 8B, 8B_flex,"
        " 8B_varlen, 70B, 405B",
        "error: --training.dataset: local dataset path './no.jsonl' does not exist; give an existing"
        " .json/.jsonl/.parquet/.txt/.csv/.arrow file or folder, 'pydoc', or an HF hub name",
    ]


def test_the_check_imports_no_torch(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", docs(8))
    code = (
        "import sys\n"
        "from torchtitan.config import ConfigError\nfrom torchtitan.checks import load_config\n"
        f"load_config(['--training.dataset={path}', '--validation.enable=true'], 1)\n"
        f"try:\n    load_config(['--training.dataset={path}', '--training.dataset_text_field=x'], 1)\n"
        "except ConfigError:\n    pass\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_the_check_and_its_modules_import_no_torch(repo_root, subprocess_env):
    code = (
        "import sys\n"
        "import torchtitan.planning.memory.model_states, torchtitan.planning.memory.budget\n"
        "from torchtitan.config import ConfigError\nfrom torchtitan.checks import load_config\n"
        "try:\n"
        f"    load_config(['--job.config_file', {V3_DEBUG!r}, '--model.flavor=671B',"
        " '--planning.memory_budget_gib=1'], 2)\n"
        "except ConfigError as e:\n"
        "    assert 'model states alone need' in str(e), e\n"
        "else:\n"
        "    raise SystemExit('not refused')\n"
        "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
        "assert not bad, bad[:5]\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=repo_root,
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr


def test_args_import_without_torch(repo_root):
    code = (
        "import sys; import torchtitan.models.deepseek_v3.args; assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], cwd=repo_root, check=True)


# --------------------------------------------------------------------------- python -m torchtitan.checks


def _run_check(args, env, repo_root, ngpu=None):
    env = dict(env)
    if ngpu is not None:
        env["NGPU"] = str(ngpu)
    return subprocess.run(
        [sys.executable, "-m", "torchtitan.checks", *args],
        cwd=repo_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
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
    proc = _run_check(
        ["--parallelism.data_parallel_shard_degree=2"], subprocess_env, repo_root, ngpu=4
    )
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "error: parallel degrees multiply to 2 (replicate 1 x shard 2 x tp 1 x pp 1) but the world size is 4;"
        " make them multiply to 4 or set --parallelism.data_parallel_shard_degree=auto"
    ]


def test_check_module_help_exits_0(subprocess_env, repo_root):
    proc = _run_check(["--help"], subprocess_env, repo_root)
    assert proc.returncode == 0
    assert "  --parallelism.tensor_parallel_degree (int, default 1)" in proc.stdout.splitlines()


# --------------------------------------------------------------------------- run_train.sh


def test_run_train_refuses_671b_on_two_ranks_in_seconds_without_torch(repo_root, subprocess_env):
    """The issue's command: before, 100 s of building ended by the OOM killer; now one line, exit 2."""
    env = dict(subprocess_env, NGPU="2", CONFIG_FILE=V3_DEBUG)
    start = time.perf_counter()
    out = subprocess.run(
        [os.path.join(repo_root, "run_train.sh"), "--model.flavor=671B"],
        cwd=repo_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    elapsed = time.perf_counter() - start
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "error: --model.flavor=671B: model states alone need 4,999.5 GiB per rank (parameters 1,249.9,"
    ), lines
    assert "2 ranks) but the memory budget is" in lines[0]
    assert elapsed < 30, elapsed  # about 0.4 s here; no worker starts


# --------------------------------------------------------------------------- the hub, offline


def test_real_hub_lookup_offline_fails_at_once():
    code = (
        "from torchtitan.config import ConfigError\nfrom torchtitan.checks import load_config\n"
        "try:\n    load_config(['--training.dataset=allenai/c4', '--training.dataset_config_name=en'], 1)\n"
        "except ConfigError as e:\n    print(e)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.stdout.startswith(
        "--training.dataset='allenai/c4': cannot reach the Hugging Face hub: offline mode"
        " is on (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE)"
    ), proc.stdout + proc.stderr
    assert proc.stderr == ""


# --------------------------------------------------------------------------- the budget's nvidia-smi


def test_nvidia_smi_is_read_torch_free(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text('#!/bin/sh\necho "$@" > "$(dirname "$0")/args"\nprintf \'81559\\n81559\\n\'\n')
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert memory_budget.gpu_memory_bytes() == [81559 * 2**20] * 2
    assert (tmp_path / "args").read_text().split() == [
        "--query-gpu=memory.total",
        "--format=csv,noheader,nounits",
        "--id=0,1",
    ]
    smi.write_text("#!/bin/sh\nexit 9\n")
    assert memory_budget.gpu_memory_bytes() is None
