"""What a run leaves behind, how it fails, and that it exits 0 when it succeeds."""

import json
import os
import subprocess
import sys

import run_tests

ROOT = run_tests.ROOT


def _run(args, ngpu=2, cwd=None):
    env = {**os.environ, "NGPU": str(ngpu)}
    return subprocess.run([run_tests.RUN_TRAIN, *args], env=env, capture_output=True, text=True, cwd=cwd)


def test_outputs_metrics_tensorboard_plot(tmp_path):
    dump = tmp_path / "run"
    # From another working directory, with the default config file, to check the launcher.
    proc = _run(["--model.flavor=tiny", "--training.steps=3", "--training.seq_len=32",
                 f"--job.dump_folder={dump}"], cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("step ")]
    assert len(lines) == 3 and "eta" in lines[-1] and "tok/s" in lines[-1]
    records = [json.loads(x) for x in (dump / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    for key in ("step", "loss", "grad_norm", "lr", "tokens_per_sec", "memory_gib", "eta_sec"):
        assert all(key in r for r in records), key
    events = list((dump / "tb").glob("events.out.tfevents.*"))
    assert len(events) == 1 and events[0].stat().st_size > 0
    png = tmp_path / "loss.png"
    plot = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "plot_loss.py"), str(dump),
                           "--out", str(png)], capture_output=True, text=True)
    assert plot.returncode == 0, plot.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_nonfinite_loss_stops_with_step(tmp_path):
    proc = _run(["--model.flavor=tiny", "--training.seq_len=32", "--optimizer.lr=1e25",
                 "--training.max_norm=0", "--lr_scheduler.warmup_steps=0", f"--job.dump_folder={tmp_path / 'nan'}"])
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert errors and "at step 2: training stopped" in errors[0], proc.stderr[-2000:]
