"""What upstream has and cannot run here, and a named hub dataset offline, refused by the
pre-launch check as run_train.sh runs it: exit 2, one error line, nothing written."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_c4_offline_fails_before_launch_in_one_line(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "NGPU": "1", "HF_HOME": str(tmp_path)}
    env.pop("HF_DATASETS_OFFLINE", None)
    proc = subprocess.run(
        [sys.executable, "-m", "torchtitan.checks", "--training.dataset=c4"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (
        "error: --training.dataset='c4' (allenai/c4): cannot reach the Hugging Face hub: offline mode"
        " is on (HF_HUB_OFFLINE); unset HF_HUB_OFFLINE to stream it, or use --training.dataset=c4_test"
        " (the bundled 2K-document sample, no network)\n"
    )


def test_refusal_happens_before_any_process_starts(tmp_path):
    # run_train.sh's pre-launch check: exit 2, one error line, nothing written
    dump = tmp_path / "dump"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchtitan.checks",
            "--model.name=llama4",
            f"--job.dump_folder={dump}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2
    assert [line for line in r.stderr.splitlines() if line.startswith("error:")] == [
        line for line in r.stderr.splitlines() if "llama4" in line
    ]
    assert not dump.exists()
