"""What the replica-group tests share (test_fault_tolerance_runs.py, test_semi_sync_runs.py):
the tiny job they train, and scripts/ft_local.py run to its summary."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = [
    "--model.flavor=tiny",
    "--training.seq_len=64",
    "--training.local_batch_size=2",
    "--training.device=cpu",
    "--training.mixed_precision_param=float32",
    "--metrics.log_freq=1",
    "--metrics.enable_tensorboard=false",
    # a constant lr: the first steps of a shorter run are those of a longer one, and a
    # reference that steps the schedule once per replica keeps the same lr
    "--lr_scheduler.warmup_steps=0",
    "--lr_scheduler.decay_ratio=0",
    # no start-up prediction (no budget; no local profile: QUICK_ENV): nothing here reads it,
    # and it is a process of its own per launch
    "--planning.memory_budget_gib=none",
]
QUICK_ENV = {"TITAN_PROFILE_CACHE": "none"}


def ft_local(dump, *args: str, ranks: int, env: dict | None = None, timeout: int = 300):
    """scripts/ft_local.py with 2 groups of `ranks` ranks (`args`: its own, then `--` and the
    job's); (its summary, its output). Fails the test on a non-zero exit or no summary."""
    done = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "scripts", "ft_local.py"),
            "--groups=2",
            f"--ranks={ranks}",
            f"--dump={dump}",
            f"--timeout={timeout - 100}",
            *args,
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT, **QUICK_ENV, **(env or {})},
        cwd=ROOT,
        timeout=timeout,
    )
    out = done.stdout + done.stderr
    line = [ln for ln in out.splitlines() if ln.startswith("[ft_local] summary ")]
    assert done.returncode == 0 and line, out[-5000:]
    return json.loads(line[-1].split(" ", 2)[2]), out


def rows(path: str) -> dict[int, dict]:
    """A metrics.jsonl's training records by step."""
    with open(path) as f:
        return {r["step"]: r for r in map(json.loads, f) if "loss" in r}
