"""What a run leaves behind, how it fails, and that it exits 0 when it succeeds."""

import json
import os
import subprocess
import sys

import run_tests

ROOT = run_tests.ROOT


def _run(args, ngpu=2, cwd=None):
    env = {**os.environ, "NGPU": str(ngpu)}
    return subprocess.run(
        [run_tests.RUN_TRAIN, *args], env=env, capture_output=True, text=True, cwd=cwd
    )


def test_outputs_metrics_tensorboard_plot(tmp_path):
    dump = tmp_path / "run"
    # From another working directory, with the default config file, to check the launcher.
    proc = _run(
        [
            "--model.flavor=tiny",
            "--training.steps=3",
            "--training.seq_len=32",
            "--profiling.enable_profiling=true",
            "--profiling.profile_freq=2",
            "--profiling.profiler_warmup=1",
            "--profiling.enable_memory_snapshot=true",
            f"--job.dump_folder={dump}",
        ],
        cwd=str(tmp_path),
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    # Profiler: step 2 (a multiple of profile_freq) traced by every rank, named after its step.
    traces = sorted(
        p.relative_to(dump / "profile_traces").as_posix()
        for p in (dump / "profile_traces").rglob("*")
    )
    assert traces == [
        "iteration_2",
        "iteration_2/rank0_trace.json",
        "iteration_2/rank1_trace.json",
    ], traces
    events = json.loads((dump / "profile_traces/iteration_2/rank1_trace.json").read_text())[
        "traceEvents"
    ]
    names = {e.get("name") for e in events}
    assert len(events) > 1000 and "ProfilerStep#2" in names and "gloo:all_gather" in names
    assert (
        "[torchtitan] profiling.enable_memory_snapshot is CUDA-only (this run is on cpu)"
        in proc.stdout
    )
    assert not (dump / "memory_snapshot").exists()
    lines = [line for line in proc.stdout.splitlines() if line.startswith("step ")]
    assert (
        len(lines) == 3 and "eta" in lines[-1] and "tok/s/dev" in lines[-1] and " rss " in lines[-1]
    )
    records = [json.loads(x) for x in (dump / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    for key in (
        "step",
        "loss",
        "grad_norm",
        "lr",
        "tokens_per_sec",
        "tokens_per_sec_per_device",
        "memory_rss_gib",
        "eta_sec",
    ):
        assert all(key in r for r in records), key
    events = list((dump / "tb").glob("events.out.tfevents.*"))
    assert len(events) == 1 and events[0].stat().st_size > 0
    png = tmp_path / "loss.png"
    plot = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "scripts", "plot_loss.py"),
            str(dump),
            "--out",
            str(png),
        ],
        capture_output=True,
        text=True,
    )
    assert plot.returncode == 0, plot.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_nonfinite_step_stops_the_run_saves_nothing_and_every_rank_shows_its_last_lines(tmp_path):
    # Steps 1-4 do not log: the non-finite gradient norm of step 2 stays on the device until
    # the sync point before step 3's checkpoint, which reads it and writes nothing (steps 1
    # and 2 are no checkpoint steps: the interval is 3). Every rank stops with the same line.
    dump = tmp_path / "nan"
    rc, _, out = run_tests.run(
        2,
        [
            "--optimizer.lr=1e25",
            "--training.max_norm=0",
            "--lr_scheduler.warmup_steps=0",
            "--metrics.log_freq=5",
            "--checkpoint.enable=true",
            "--checkpoint.interval=3",
            "--training.steps=6",
        ],
        str(dump),
    )
    assert rc == 1, out[-3000:]
    errors = [line for line in out.splitlines() if line.startswith("error: ")]
    assert errors and errors[0].startswith(
        "error: gradient norm is nan at step 2: training stopped"
    ), out[-2000:]
    assert "step 3/" not in out and "step 2/" not in out  # nothing logged: steps 1-4 do not log
    folder = dump / "checkpoint"
    assert not folder.exists() or not [
        p.name for p in folder.iterdir() if p.name.startswith("step-")
    ]
    # run_tests.run keeps each rank's output (<dump>/ranks) and shows every rank's tail on failure
    for rank in (0, 1):
        tail = out.split(f"--- rank {rank} stderr.log:\n", 1)[1]
        assert tail.splitlines()[0].startswith("error: gradient norm is nan at step 2"), out[-3000:]
