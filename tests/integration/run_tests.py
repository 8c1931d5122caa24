#!/usr/bin/env python3
"""The multi-rank suite's runner: named run_train.sh cases, each checked against a 1-rank
reference. The cases, their settings and references are parity_cases.py; this module launches
runs (launch(), run(): also the other integration tests' way to train), compares and reports.

    python tests/integration/run_tests.py --ngpu 8                # every case of <= 8 ranks, on CPU
    python tests/integration/run_tests.py --ngpu 4 --filter pp    # cases whose name contains "pp"
    python tests/integration/run_tests.py --device cuda --ngpu 8  # on GPUs, one per rank (NCCL)
    python tests/integration/run_tests.py --launcher torchrun     # every run through run_train.sh

Runs are pinned to a device: CPU ranks (gloo) unless --device cuda, which skips, with the
reason, every case needing more ranks than the GPUs present. Every case trains the tiny
Llama3 (or DeepSeek-V3, deepseek_*; Qwen3, qwen3_*) for 10 steps with the same global batch as
its 1-rank reference of the same model and dtype (fp32, or bf16 for cases named bf16_*), and
passes when it exits 0 within --timeout seconds and every step's loss and gradient norm are
within the case's tolerance (relative) of the reference's (the table shows the largest
difference of each). A failing case shows every rank's last lines. Runs get run_train.sh's
argv and environment; on CPU their ranks are forked from one process that imported torchtitan
once (fast_launch.py) unless --launcher torchrun (or TITAN_TEST_LAUNCHER=torchrun).
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

if os.path.dirname(os.path.abspath(__file__)) not in sys.path:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fast_launch  # noqa: E402
import parity_cases  # noqa: E402  (the case table)
from parity_cases import BASE, CASES, MODELS, Case, reference_name  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN_TRAIN = os.path.join(ROOT, "run_train.sh")


def read_losses(dump: str, key: str = "loss") -> list[float]:
    with open(os.path.join(dump, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if line.strip()]
    return [
        r[key] for r in records if "loss" in r
    ]  # training records (validation ones have no "loss")


def read_grad_norms(dump: str) -> list[float]:
    """Adam hides a wrong gradient scale from the loss (it is scale invariant), not from the
    gradient norm: e.g. experts' gradients averaged over the wrong number of ranks."""
    return read_losses(dump, "grad_norm")


DEVICE = "cpu"  # every run's --training.device; main() sets it from --device
TIMEOUT_S = 900.0  # per run; main() sets it from --timeout


def tolerance(case: Case) -> float:
    """parity_cases.tolerance on this run's device (--device)."""
    return parity_cases.tolerance(case, DEVICE)


LAUNCHERS = ("fast", "torchrun")


def launcher_name(launcher: str | None = None) -> str:
    """The launcher a run uses: the argument, else $TITAN_TEST_LAUNCHER, else "fast"."""
    name = launcher or os.environ.get("TITAN_TEST_LAUNCHER") or "fast"
    if name not in LAUNCHERS:
        raise ValueError(f"launcher {name!r}: one of {', '.join(LAUNCHERS)} (TITAN_TEST_LAUNCHER)")
    return name


def run_env(ngpu: int, log_dir: str, extra_env: dict | None = None) -> dict:
    """The environment run_train.sh is started with (launch())."""
    return {**os.environ, "NGPU": str(ngpu), "TORCHRUN_LOG_DIR": log_dir, **(extra_env or {})}


def chosen_launcher(env: dict, launcher: str | None = None) -> str:
    """launcher_name(), but "torchrun" when env changes a variable read at import time."""
    name = launcher_name(launcher)
    return "torchrun" if name == "fast" and fast_launch.needs_torchrun(env) else name


def kill_tree(pid: int) -> None:
    """SIGKILL `pid`, its process group and every process below it: run_train.sh's launcher
    runs in a process group of its own, and torchrun's workers in sessions of their own."""
    children: dict[int, list[int]] = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as f:
                children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(
                    int(name)
                )
        except OSError:
            continue
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += children.get(p, [])
    for p in [pid, *tree]:
        try:
            os.killpg(p, signal.SIGKILL) if p == pid else os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def launch(
    ngpu: int,
    args: list[str],
    log_dir: str,
    extra_env: dict | None = None,
    launcher: str | None = None,
) -> tuple[int, float, str]:
    """Train with `run_train.sh <args>` on `ngpu` ranks; (exit code, seconds, console output).

    launcher "torchrun" runs run_train.sh itself (every rank's output also under log_dir, its
    TORCHRUN_LOG_DIR); "fast" (the default) forks the ranks from a process that imported
    torchtitan once per session (fast_launch.py: the same argv, environment, per-rank log
    files under log_dir and console), unless extra_env changes what is read at import time.
    The console is what run_train.sh shows: the LOG_RANK ranks' output (default rank 0).
    Exit code 124: killed at TIMEOUT_S."""
    env = run_env(ngpu, log_dir, extra_env)
    start = time.perf_counter()
    if chosen_launcher(env, launcher) == "fast":
        # run_train.sh runs a dry run (--job.dry_run=true) in one process of torchtitan.dry_run
        rc, out = fast_launch.launch(
            ngpu, args, log_dir, env, TIMEOUT_S, dry_run="--job.dry_run=true" in args
        )
    else:
        proc = subprocess.Popen(
            [RUN_TRAIN, *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )  # its own process group: a timeout kills every rank
        try:
            out, _ = proc.communicate(timeout=TIMEOUT_S)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            out, _ = proc.communicate()
            rc = 124
        out = re.sub(
            r"(?m)^\[default\d+\]:", "", out
        )  # torchrun's --tee prefix: the console as without it
    if rc == 124:
        out += f"\n[run_tests] killed after {TIMEOUT_S:.0f}s (--timeout)\n"
    return rc, time.perf_counter() - start, out


def run(
    ngpu: int,
    overrides: list[str],
    dump: str,
    extra_env: dict | None = None,
    model: str = "llama3",
    dtype: str = "float32",
    launcher: str | None = None,
) -> tuple[int, float, str]:
    """One training run of the suite's settings (BASE) plus `overrides`; (exit code, seconds,
    output). Every rank's output also goes to <dump>/ranks/ and a failed or timed-out run's
    output ends with each rank's last lines. Exit code 124: killed at TIMEOUT_S. launcher:
    see launch()."""
    logs = os.path.join(dump, "ranks")
    name, flavor, model_args = MODELS.get(model, (model, "tiny", []))
    args = [
        f"--model.name={name}",
        *BASE,
        f"--model.flavor={flavor}",
        *model_args,
        f"--training.device={DEVICE}",
        f"--training.mixed_precision_param={dtype}",
        *overrides,
        f"--job.dump_folder={dump}",
    ]
    rc, secs, out = launch(ngpu, args, logs, extra_env, launcher)
    if rc != 0:
        out += rank_tails(logs)
    return rc, secs, out


def rank_tails(log_dir: str, lines: int = 8) -> str:
    """The last lines of every rank's stdout and stderr under a torchrun --log-dir."""
    out = []
    for root, _, files in sorted(os.walk(log_dir)):
        for name in sorted(files):
            if name in ("stdout.log", "stderr.log"):
                with open(os.path.join(root, name), errors="replace") as f:
                    tail = [ln.rstrip() for ln in f.readlines() if ln.strip()][-lines:]
                if tail:
                    rank = os.path.basename(root)
                    out.append(f"--- rank {rank} {name}:\n" + "\n".join(tail))
    return ("\n" + "\n".join(out) + "\n") if out else ""


def skip_reason(case: Case, device: str, gpus: int) -> str:
    """Why `case` cannot run here ("" if it can)."""
    if device == "cuda" and case.ngpu > gpus:
        return f"needs {case.ngpu} GPUs, {gpus} present"
    return ""


def cuda_count() -> int:
    """GPUs torch sees, asked in a child process (this one stays free of CUDA)."""
    code = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return int(proc.stdout.strip() or 0) if proc.returncode == 0 else 0


def max_rel_diff(a: list[float], b: list[float]) -> float:
    if len(a) != len(b):
        return float("inf")
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))


def main(argv=None) -> int:
    global DEVICE, TIMEOUT_S
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--ngpu", type=int, default=8, help="run the cases of at most this many ranks")
    ap.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="cpu: every rank a CPU process (gloo); cuda: one GPU per rank (NCCL)",
    )
    ap.add_argument(
        "--filter",
        action="append",
        default=[],
        help="only cases whose name contains this (given again: any of them)",
    )
    ap.add_argument("--slow", action="store_true", help="include the slow cases")
    ap.add_argument(
        "--timeout", type=float, default=TIMEOUT_S, help="seconds a run may take (default 900)"
    )
    ap.add_argument("--out", default="", help="folder for the runs (default: a temporary one)")
    ap.add_argument("--list", action="store_true", help="print the cases and exit")
    ap.add_argument(
        "--launcher",
        choices=LAUNCHERS,
        help="fast: ranks forked from one process that imported torchtitan once (default on cpu);"
        " torchrun: run_train.sh (default on cuda); also TITAN_TEST_LAUNCHER",
    )
    args = ap.parse_args(argv)
    if args.launcher:
        os.environ["TITAN_TEST_LAUNCHER"] = args.launcher
    elif (
        args.device == "cuda"
    ):  # the fast launcher has not been tried on GPUs yet: opt in with --launcher fast
        os.environ.setdefault("TITAN_TEST_LAUNCHER", "torchrun")
    DEVICE, TIMEOUT_S = args.device, args.timeout

    cases = [
        c
        for c in CASES
        if c.ngpu <= args.ngpu
        and (not args.filter or any(f in c.name for f in args.filter))
        and (args.slow or not c.slow)
    ]
    if args.list:
        for c in cases:
            print(f"{c.name:32s} {c.ngpu}  {' '.join(c.overrides)}")
        return 0
    if not cases:
        print(
            f"error: no case matches --filter {' '.join(args.filter)!r} with --ngpu {args.ngpu}",
            file=sys.stderr,
        )
        return 2
    gpus = cuda_count() if args.device == "cuda" else 0
    skipped = {c.name: skip_reason(c, args.device, gpus) for c in cases}
    out = args.out or tempfile.mkdtemp(prefix="titan_suite_")
    print(
        f"device {args.device}"
        + (f" ({gpus} GPUs)" if args.device == "cuda" else "")
        + f", runs in {out}"
    )

    references = {}
    for model, dtype, mask in dict.fromkeys(
        (c.model, c.dtype, c.attn_mask) for c in cases if not skipped[c.name]
    ):
        name = reference_name(model, dtype, mask)
        rc, secs, log = run(
            1,
            parity_cases.reference_overrides(mask),
            os.path.join(out, name),
            model=model,
            dtype=dtype,
        )
        if rc != 0:
            print(log[-3000:])
            print(f"error: the 1-rank {model} {dtype} reference run failed", file=sys.stderr)
            return 1
        references[name] = (
            read_losses(os.path.join(out, name)),
            read_grad_norms(os.path.join(out, name)),
        )
        print(f"{name} (1 rank): final loss {references[name][0][-1]:.6f}  ({secs:.1f}s)")
    print(
        f"{'case':32s} {'world':>5s}  {'result':6s} {'loss diff':>10s} {'gnorm diff':>10s} {'final loss':>10s}"
        f" {'wall s':>7s}"
    )
    failures = 0
    for case in cases:
        if skipped[case.name]:
            print(f"{case.name:32s} {case.ngpu:>5d}  SKIP   {skipped[case.name]}", flush=True)
            continue
        dump = os.path.join(out, case.name)
        rc, secs, log = run(
            case.ngpu,
            case.overrides,
            dump,
            model=case.model,
            dtype=case.dtype,
            launcher=case.launcher,
        )
        losses = (
            read_losses(dump)
            if rc == 0 and os.path.exists(os.path.join(dump, "metrics.jsonl"))
            else []
        )
        ref_losses, ref_norms = references[reference_name(case.model, case.dtype, case.attn_mask)]
        diff = max_rel_diff(losses, ref_losses) if losses else float("inf")
        norm_diff = max_rel_diff(read_grad_norms(dump), ref_norms) if losses else float("inf")
        ok = rc == 0 and max(diff, norm_diff) <= tolerance(case)
        failures += not ok
        final = f"{losses[-1]:.6f}" if losses else "-"
        print(
            f"{case.name:32s} {case.ngpu:>5d}  {'PASS' if ok else 'FAIL':6s} {diff:>10.2e} {norm_diff:>10.2e}"
            f" {final:>10s} {secs:>7.1f}",
            flush=True,
        )
        if not ok:
            print(f"--- {case.name}: exit {rc}; last output:\n{log[-6000:]}\n---")
    n_skipped = sum(bool(v) for v in skipped.values())
    print(f"{len(cases) - failures - n_skipped} passed, {failures} failed, {n_skipped} skipped")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
