#!/usr/bin/env python3
"""Checkpoint measurements on real multi-rank runs: exact resume, layout change, and a rank
killed mid-step. test_checkpoint.py asserts on them; run this file to print the tables.

    python tests/integration/checkpoint_checks.py [--out DIR]

Exact resume: one run trains 10 steps and checkpoints at steps 5 and 10 (the "straight"
losses); its step-10 checkpoint is removed and the same command runs again, so a fresh set
of processes loads step 5 and trains steps 6..10 (the "resumed" losses).
"""

import argparse
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
import parity_cases  # noqa: E402
import run_tests  # noqa: E402

CKPT = ["--checkpoint.enable=true", "--checkpoint.interval=5"]
PP, TP = parity_cases.PP, parity_cases.TP
# name -> (ranks, overrides); global batch 8 in every layout (parity_cases.BASE)
LAYOUTS = {
    "fsdp": (4, []),
    "fsdp+tp": (4, [TP, "--training.local_batch_size=4"]),
    "pp+fsdp": (
        4,
        [
            PP,
            "--parallelism.pipeline_parallel_schedule=Interleaved1F1B",
            "--training.local_batch_size=4",
        ],
    ),
    "simple_fsdp": (2, ["--parallelism.fsdp_implementation=simple_fsdp"]),
    # DeepSeek-V3 (tiny): experts split 2 and 4 ways
    "deepseek_ep2": (2, [parity_cases.EP]),
    "deepseek_ep4": (
        4,
        ["--parallelism.expert_parallel_degree=4", "--training.local_batch_size=2"],
    ),
    # context parallel: every rank holds half of each sequence; and the same batch on 1 rank
    "cp2": (2, [parity_cases.CP2, "--training.local_batch_size=8"]),
    "cp1": (1, ["--training.local_batch_size=8"]),
}


def losses(dump: str) -> dict[int, float]:
    with open(os.path.join(dump, "metrics.jsonl")) as f:
        return {r["step"]: r["loss"] for r in map(json.loads, filter(str.strip, f))}


def straight_losses(dump: str) -> dict[int, float]:
    with open(os.path.join(dump, "straight.jsonl")) as f:
        return {r["step"]: r["loss"] for r in map(json.loads, filter(str.strip, f))}


def train(layout: str, dump: str, extra: list[str] = ()) -> str:
    ngpu, overrides = LAYOUTS[layout]
    model = parity_cases.DS if layout.startswith("deepseek") else "llama3"
    rc, _, log = run_tests.run(ngpu, [*overrides, *CKPT, *extra], dump, model=model)
    if rc != 0:
        raise RuntimeError(f"{layout} run in {dump} failed (exit {rc}):\n{log[-3000:]}")
    return log


def straight_run(layout: str, dump: str) -> dict[int, float]:
    """10 steps, checkpoints at 5 and 10; returns the losses (kept as straight.jsonl)."""
    train(layout, dump)
    shutil.copy(os.path.join(dump, "metrics.jsonl"), os.path.join(dump, "straight.jsonl"))
    return losses(dump)


def resumed_run(layout: str, dump: str) -> tuple[dict[int, float], str]:
    """Drop step-10, run the same command again: it resumes from step 5."""
    shutil.rmtree(os.path.join(dump, "checkpoint", "step-10"))
    log = train(layout, dump)
    return losses(dump), log


def layout_change(source_dump: str, layout: str, dump: str) -> tuple[dict[int, float], str]:
    """Copy the source run's step-5 checkpoint into a fresh folder and train `layout` from it."""
    os.makedirs(os.path.join(dump, "checkpoint"))
    shutil.copytree(
        os.path.join(source_dump, "checkpoint", "step-5"),
        os.path.join(dump, "checkpoint", "step-5"),
    )
    log = train(layout, dump)
    return losses(dump), log


def _workers(dump: str) -> dict[int, int]:
    """RANK -> pid of this run's torchrun workers (found through /proc)."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().decode(errors="replace").split("\0")
            if "torchtitan.train" not in cmd or not any(dump in c for c in cmd):
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(
                    e.split("=", 1)
                    for e in f.read().decode(errors="replace").split("\0")
                    if "=" in e
                )
            if "RANK" in env:
                found[int(env["RANK"])] = int(pid)
        except OSError:
            continue
    return found


def _running(pid: int) -> bool:
    """The process exists and has not exited: an exited worker stays a zombie (still in /proc)
    until torchrun reaps it, which can be after its 30 s grace for a stopped sibling."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def kill_run(
    dump: str,
    kill_rank: int = 2,
    after_step: int = 12,
    timeout: int = 20,
    steps: int = 30,
    sig: int = signal.SIGKILL,
    ngpu: int = 4,
    in_save: int | None = None,
    extra: list[str] = (),
    env: dict | None = None,
) -> dict:
    """FSDP run checkpointing every 5 steps (`extra` overrides may change it); once rank 0
    logged `after_step` (or, with in_save=N, as soon as the save of step N has begun writing
    step-N.tmp), send one worker `sig` (SIGKILL: dies; SIGSTOP: stalls) and time how long
    until every other rank has exited, and until the whole job is gone. `env`: added to the
    run's environment."""
    cmd = [
        run_tests.RUN_TRAIN,
        *parity_cases.BASE,
        f"--training.steps={steps}",
        *CKPT,
        *extra,
        f"--comm.timeout_seconds={timeout}",
        f"--job.dump_folder={dump}",
    ]
    os.makedirs(dump, exist_ok=True)
    log_path = os.path.join(os.path.dirname(dump), os.path.basename(dump) + ".log")
    with open(log_path, "w") as log:
        # Every rank's output, so each survivor's error line shows.
        env = {
            **os.environ,
            "NGPU": str(ngpu),
            "LOG_RANK": ",".join(map(str, range(ngpu))),
            **(env or {}),
        }
        proc = subprocess.Popen(
            cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    read_log = lambda: open(log_path).read()  # noqa: E731
    metrics = os.path.join(dump, "metrics.jsonl")
    deadline = time.time() + 300

    def wait_for(done, what: str, poll: float):
        while not done():
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"run ended or stalled before {what}:\n{read_log()[-3000:]}")
            time.sleep(poll)

    wait_for(lambda: os.path.exists(metrics) and len(losses(dump)) >= 1, "step 1", 0.05)
    workers = _workers(dump)
    assert sorted(workers) == list(range(ngpu)), workers
    if in_save is None:
        wait_for(lambda: len(losses(dump)) >= after_step, f"step {after_step}", 0.05)
    else:
        # The save's .tmp folder exists for a short while; should the poll miss it, the
        # finished step-N (then the kill lands just after the save) ends the wait too.
        tmp = os.path.join(dump, "checkpoint", f"step-{in_save}")
        wait_for(
            lambda: os.path.exists(tmp + ".tmp") or os.path.exists(tmp),
            f"the save of step {in_save}",
            0.002,
        )
    alive = lambda ranks: [r for r in ranks if _running(workers[r])]  # noqa: E731
    others = [r for r in workers if r != kill_rank]
    start = time.time()
    os.kill(workers[kill_rank], sig)
    others_exited = None
    try:
        while proc.poll() is None and time.time() < start + timeout + 90:
            if others_exited is None and not alive(others):
                others_exited = time.time() - start
                if (
                    sig == signal.SIGSTOP
                ):  # measured; spare torchrun's 30 s grace for a stopped process
                    try:
                        os.kill(workers[kill_rank], signal.SIGKILL)
                    except ProcessLookupError:  # torchrun got there first
                        pass
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            run_tests.kill_tree(proc.pid)
        proc.wait()
    job_gone = time.time() - start
    if others_exited is None and not alive(others):
        others_exited = job_gone
    out = read_log()
    folder = os.path.join(dump, "checkpoint")
    names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    shutil.copy(metrics, os.path.join(dump, "killed.jsonl"))
    return {
        "others_exited": others_exited,
        "job_gone": job_gone,
        "returncode": proc.returncode,
        "all_gone": not alive(list(workers)),
        "output": out,
        "killed_rank": kill_rank,
        "losses": losses(dump),
        "errors": [ln for ln in out.splitlines() if ln.startswith("error:")],
        "checkpoints": names,
        "timeout": timeout,
        "exit_codes": rank_exit_codes(out),
        "complete": [
            c for c in names if os.path.exists(os.path.join(dump, "checkpoint", c, ".complete"))
        ],
    }


def rank_exit_codes(torchrun_output: str) -> dict[int, int]:
    """rank -> exit code of each failed worker, from torchrun's failure summary (a worker
    that torchrun itself stopped shows -9: run_train.sh's launcher has it stop them with SIGKILL)."""
    codes, rank = {}, None
    for line in torchrun_output.splitlines():
        m = re.match(r"\s*rank\s*:\s*(\d+)", line)
        if m:
            rank = int(m.group(1))
        m = re.match(r"\s*exitcode\s*:\s*(-?\d+)", line)
        if m and rank is not None:
            codes[rank], rank = int(m.group(1)), None
    return codes


def resume_after_kill(
    dump: str, steps: int = 30, ngpu: int = 4, extra: list[str] = ()
) -> tuple[dict[int, float], str]:
    rc, _, log = run_tests.run(ngpu, [f"--training.steps={steps}", *CKPT, *extra], dump)
    if rc != 0:
        raise RuntimeError(f"resume after kill failed (exit {rc}):\n{log[-3000:]}")
    return losses(dump), log


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", help="folder for the runs (default: a temporary one)")
    ap.add_argument("--stall", action="store_true", help="also stall (SIGSTOP) a rank")
    args = ap.parse_args(argv)
    out = args.out or tempfile.mkdtemp(prefix="titan_ckpt_")
    ok = True

    print("exact resume: 10 steps straight vs 5 steps + resume to 10 (fp32, deterministic)")
    print(f"{'layout':10s} {'step':>4s} {'loss straight':>15s} {'loss resumed':>15s}  equal")
    for layout in ("fsdp", "fsdp+tp", "pp+fsdp"):
        dump = os.path.join(out, f"resume_{layout}")
        straight = straight_run(layout, dump)
        resumed, _ = resumed_run(layout, dump)
        for step in range(6, 11):
            same = straight[step] == resumed[step]
            ok &= same
            print(
                f"{layout:10s} {step:>4d} {straight[step]:>15.9f} {resumed[step]:>15.9f}  {'yes' if same else 'NO'}"
            )

    print("\nlayout change: fsdp (4 ranks) step-5 checkpoint loaded into another layout")
    source = os.path.join(out, "resume_fsdp")
    reference = straight_losses(source)
    print(
        f"{'saved':6s} {'loaded':12s} {'step 5 (saved run)':>19s} {'step 6 straight':>16s} {'step 6 loaded':>14s} {'rel diff':>9s}"
    )
    for layout in ("fsdp+tp", "pp+fsdp", "simple_fsdp"):
        got, _ = layout_change(source, layout, os.path.join(out, f"from_fsdp_to_{layout}"))
        rel = abs(got[6] - reference[6]) / reference[6]
        ok &= rel <= 1e-6
        print(
            f"{'fsdp':6s} {layout:12s} {reference[5]:>19.9f} {reference[6]:>16.9f} {got[6]:>14.9f} {rel:>9.2e}"
        )

    print("\nkill test: 4 ranks, SIGKILL of one worker after step 12 was logged")
    dump = os.path.join(out, "kill")
    k = kill_run(dump)
    print(
        f"killed rank {k['killed_rank']}; the other ranks exited after {k['others_exited']:.2f}s, the whole job"
        f" after {k['job_gone']:.2f}s (comm.timeout_seconds={k['timeout']}); torchrun exit {k['returncode']};"
        f" checkpoints left {k['checkpoints']}"
    )
    print(
        f"exit code per rank (torchrun's summary; -9 = stopped by torchrun): {dict(sorted(k['exit_codes'].items()))}"
    )
    for line in k["errors"]:
        print(f"    {line}")
    resumed, log = resume_after_kill(dump)
    first = min(s for s in resumed if s > 10)
    same = resumed[first] == k["losses"].get(first)
    ok &= same and k["returncode"] != 0 and k["all_gone"]
    print([ln for ln in log.splitlines() if "checkpoint:" in ln][0])
    print(
        f"resumed run's first loss: step {first} = {resumed[first]:.9f}; killed run at step {first} ="
        f" {k['losses'].get(first, float('nan')):.9f} ({'equal' if same else 'DIFFERENT'})"
    )
    if args.stall:
        print("\nstall test: 4 ranks, SIGSTOP of one worker after step 12 was logged")
        k = kill_run(
            os.path.join(out, "stall"),
            sig=signal.SIGSTOP,
            timeout=10,
            extra=["--comm.hang_timeout_seconds=0"],
        )
        print(
            f"stopped rank {k['killed_rank']}; the other ranks exited after {k['others_exited']:.2f}s"
            f" (comm.timeout_seconds={k['timeout']}); exit {k['returncode']} (the stopped rank is then killed)"
        )
        print(f"exit code per rank: {dict(sorted(k['exit_codes'].items()))}")
        for line in k["errors"]:
            print(f"    {line}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
