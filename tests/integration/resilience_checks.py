#!/usr/bin/env python3
"""Runs that survive the cluster, measured on real multi-rank CPU runs: preemption signals,
hang reports and asynchronous checkpoints. test_preemption_run.py, test_hang_report_run.py and
test_async_checkpoint_run.py assert on them; run this file to print what they show.

    python tests/integration/resilience_checks.py [--out DIR]

Preemption: a 4-rank FSDP run (the checkpoint tests' "fsdp" layout, 10 steps, checkpoints
every 5) gets SIGTERM - at its launcher, run_train.sh, as Slurm sends it, or at one worker -
after step 6; its step 7 is slowed by a 1.5 s data read (faults.py) so that the signal lands
mid-training whatever the machine's speed. The run must exit 75 with the step it stopped
after checkpointed; the same command then resumes from that checkpoint and its losses must
equal those of a run never interrupted, bitwise.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checkpoint_checks as cc  # noqa: E402
import parity_cases  # noqa: E402
import run_tests  # noqa: E402

STEPS = 10
PREEMPT = [*cc.CKPT, f"--training.steps={STEPS}"]  # + cc.LAYOUTS["fsdp"]: 4 ranks, no overrides
SLOW_STEP = 7  # its data read takes 1.5 s longer: the signal sent after step 6 lands before the end


def _stop_step(output: str) -> int | None:
    m = re.search(r"preempted: .*; stopped after step (\d+)", output)
    return int(m.group(1)) if m else None


def preempt_run(
    dump: str,
    target: str = "launcher",
    sig: int = signal.SIGTERM,
    rank: int = 2,
    extra: list[str] = (),
    after_step: int = 6,
) -> dict:
    """run_train.sh (torchrun, 4 ranks) of the fsdp layout; once step `after_step` is logged,
    `sig` to the launcher (target "launcher") or to worker `rank` ("worker")."""
    os.makedirs(dump, exist_ok=True)
    env = {**os.environ, "NGPU": "4", "TORCHTITAN_FAULT": f"sleep=1.5@data:step={SLOW_STEP}"}
    cmd = [run_tests.RUN_TRAIN, *parity_cases.BASE, *PREEMPT, *extra, f"--job.dump_folder={dump}"]
    log_path = dump + ".log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    metrics = os.path.join(dump, "metrics.jsonl")
    deadline = time.time() + 240
    try:
        while not (os.path.exists(metrics) and len(cc.losses(dump)) >= after_step):
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(
                    f"the run ended or stalled before step {after_step}:\n{open(log_path).read()[-3000:]}"
                )
            time.sleep(0.05)
        pid = proc.pid if target == "launcher" else cc._workers(dump)[rank]
        sent = time.time()
        os.kill(pid, sig)
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            run_tests.kill_tree(proc.pid)
            proc.wait()
    exit_s = time.time() - sent
    out = re.sub(r"(?m)^\[default\d+\]:", "", open(log_path).read())
    folder = os.path.join(dump, "checkpoint")
    names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    shutil.copy(os.path.join(dump, "metrics.jsonl"), os.path.join(dump, "preempted.jsonl"))
    return {
        "rc": rc,
        "output": out,
        "step": _stop_step(out),
        "exit_s": exit_s,
        "checkpoints": names,
        "lines": [ln for ln in out.splitlines() if "preempted" in ln or ln.startswith("error:")],
        "losses": cc.losses(dump),
    }


def marker(dump: str, step: int) -> dict:
    with open(os.path.join(dump, "checkpoint", f"step-{step}", ".complete")) as f:
        return json.load(f)


def resume(dump: str, extra: list[str] = ()) -> tuple[dict[int, float], str]:
    """The same command again (4 ranks): it resumes from the newest checkpoint."""
    rc, _, log = run_tests.run(4, [*PREEMPT, *extra], dump)
    if rc != 0:
        raise RuntimeError(f"the resumed run failed (exit {rc}):\n{log[-3000:]}")
    return cc.losses(dump), log


def hang_run(dump: str, fault: str, hang_s: int = 3, timeout_s: int = 60, steps: int = 30) -> dict:
    """4 ranks with TORCHTITAN_FAULT=`fault` (a rank frozen or stuck), the watchdog at
    `hang_s`, the collective timeout at `timeout_s`; what the console and <dump>/hang/ hold."""
    rc, secs, out = run_tests.run(
        4,
        [
            f"--training.steps={steps}",
            f"--comm.timeout_seconds={timeout_s}",
            f"--comm.hang_timeout_seconds={hang_s}",
        ],
        dump,
        extra_env={"TORCHTITAN_FAULT": fault},
    )
    folder = os.path.join(dump, "hang")
    report = (
        open(os.path.join(folder, "report.txt")).read()
        if os.path.exists(os.path.join(folder, "report.txt"))
        else ""
    )
    console = out.split("\n--- rank ")[
        0
    ]  # without the ranks' last lines run_tests.run adds on failure
    return {
        "rc": rc,
        "seconds": secs,
        "output": out,
        "report": report,
        "lines": [ln for ln in console.splitlines() if ln.startswith("error: hang:")],
        "files": sorted(os.path.basename(p) for p in glob.glob(os.path.join(folder, "*"))),
    }


ASYNC = ["--checkpoint.interval=3", "--checkpoint.async_mode=async"]


def async_kill_run(dump: str, kill_rank: int = 1) -> dict:
    """2 ranks saving every 3 steps asynchronously; step 6's write takes 30 s more (every
    rank), so training goes on while it is written; `kill_rank` is killed once step 8 is
    logged, in the middle of that write."""
    return cc.kill_run(
        dump,
        kill_rank=kill_rank,
        ngpu=2,
        after_step=8,
        steps=12,
        extra=ASYNC,
        env={"TORCHTITAN_FAULT": "sleep=30@checkpoint_write:step=6"},
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", help="folder for the runs (default: a temporary one)")
    args = ap.parse_args(argv)
    out = args.out or tempfile.mkdtemp(prefix="titan_resilience_")
    straight = cc.straight_run("fsdp", os.path.join(out, "straight"))
    ok = True
    for name, target, sig, extra in (
        ("launcher", "launcher", signal.SIGTERM, ASYNC[1:]),
        ("worker", "worker", signal.SIGTERM, []),
    ):
        dump = os.path.join(out, f"preempt_{name}")
        p = preempt_run(dump, target, sig, extra=extra)
        print(
            f"\nSIGTERM to the {'launcher (run_train.sh)' if target == 'launcher' else 'worker of rank 2'},"
            f" 4 ranks, {'async' if extra else 'sync'} checkpoints: exit {p['rc']} after {p['exit_s']:.1f}s"
        )
        for line in p["lines"]:
            print(f"    {line}")
        step = p["step"]
        print(
            f"    checkpoints: {p['checkpoints']}; step-{step} marker: step {marker(dump, step)['step']}"
        )
        resumed, log = resume(dump, extra)
        print("    " + next(ln for ln in log.splitlines() if "checkpoint: resumed" in ln))
        print(f"    {'step':>4} {'uninterrupted':>15} {'preempted+resumed':>18}  equal")
        for s in range(1, STEPS + 1):
            same = resumed[s] == straight[s]
            ok &= same
            print(
                f"    {s:>4} {straight[s]:>15.9f} {resumed[s]:>18.9f}  {'yes' if same else 'NO'}"
                + ("   <- preempted after this step" if s == step else "")
            )
    for i, (what, fault) in enumerate(
        (
            ("rank 2 frozen (SIGSTOP) in its data read of step 4", "stop@data:rank=2:step=4"),
            ("rank 0 frozen (SIGSTOP) inside step 4", "stop@step:rank=0:step=4"),
            ("rank 1 stuck (alive) in its data read of step 4", "sleep=300@data:rank=1:step=4"),
        )
    ):
        h = hang_run(os.path.join(out, f"hang_{i}"), fault)
        print(
            f"\nhang: {what}: exit {h['rc']} after {h['seconds']:.1f}s (hang_timeout_seconds=3, timeout_seconds=60)"
        )
        print("    " + "\n    ".join(h["lines"] or ["NO REPORT"]))
        print("    " + "\n    ".join(h["report"].splitlines()[2:]))
        ok &= bool(h["lines"]) and h["rc"] == 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
