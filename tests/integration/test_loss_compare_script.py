"""scripts/loss_compare.py on metrics files: the table, --assert-equal, --rtol, --steps, the PNG."""

import json
import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "scripts",
    "loss_compare.py",
)


def write(path, losses):
    with open(path, "w") as f:
        for step, loss in losses.items():
            f.write(json.dumps({"step": step, "loss": loss}) + "\n")
    return str(path)


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *map(str, args)], capture_output=True, text=True)


@pytest.fixture
def runs(tmp_path):
    a = write(tmp_path / "a.jsonl", {1: 8.0, 2: 7.5, 3: 7.25})
    b = write(tmp_path / "b.jsonl", {1: 8.0, 2: 7.5, 3: 7.25})
    c = write(tmp_path / "c.jsonl", {1: 8.0, 2: 7.5000001, 3: 7.25})
    return a, b, c


def test_equal_runs_pass_bitwise(runs):
    a, b, _ = runs
    proc = run(a, b, "--assert-equal")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["step", "a", "b", "rel", "diff"]
    assert lines[2].split() == ["2", "7.5000000", "7.5000000", "0.00e+00"]
    assert lines[-1] == "OK: 3 steps equal bitwise"


def test_tiny_difference_fails_bitwise_passes_rtol(runs):
    a, _, c = runs
    proc = run(a, c, "--assert-equal")
    assert proc.returncode == 1
    assert "FAIL: losses not equal bitwise: step 2: 7.5 vs 7.5000001" in proc.stdout
    assert run(a, c, "--assert-equal", "--rtol", "1e-6").returncode == 0
    assert run(a, c).returncode == 0  # without --assert-equal it only reports


def test_missing_steps_fail_unless_excluded(tmp_path, runs):
    a = runs[0]
    resumed = write(tmp_path / "r.jsonl", {2: 7.5, 3: 7.25})
    proc = run(a, resumed, "--assert-equal")
    assert proc.returncode == 1 and "step 1 only in run a" in proc.stdout
    assert run(a, resumed, "--assert-equal", "--steps", "2:3").returncode == 0


def test_png_and_dump_folder_input(tmp_path, runs):
    folder = tmp_path / "run"
    folder.mkdir()
    write(folder / "metrics.jsonl", {1: 8.0, 2: 7.5, 3: 7.25})
    png = tmp_path / "cmp.png"
    proc = run(runs[0], folder, "--png", png, "--labels", "x,y")
    assert proc.returncode == 0, proc.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_missing_input_is_one_line_error(tmp_path, runs):
    proc = run(runs[0], tmp_path / "nope.jsonl")
    assert proc.returncode == 2
    assert (
        proc.stderr.strip()
        == f"error: metrics file '{tmp_path / 'nope.jsonl'}' not found; pass a metrics.jsonl, a dump folder or a .toml config"
    )


def test_no_overlapping_steps_fail_assert_equal(runs):
    proc = run(runs[0], runs[1], "--assert-equal", "--steps", "50:60")
    assert proc.returncode == 1 and "FAIL: no steps to compare in --steps 50:60" in proc.stdout
