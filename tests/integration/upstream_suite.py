"""Upstream torchtitan's integration suite (upstream_cases.py) run against this repository, on
upstream's own base TOML, and what became of each case as a markdown table:

    python -m tests.integration.upstream_suite [--case NAME] [--slow] [--disabled] [--steps N]
        [--config tests/upstream/base_config.toml] [--table docs/upstream_suite.md]
        [--launcher fast|torchrun] [--timeout S] [--out DIR]

Each run is upstream's command, `CONFIG_FILE=<config> NGPU=<ngpu> ./run_train.sh <the case's
strings>`, with what makes it take seconds on CPU ranks appended: --training.seq_len=64 and
--training.local_batch_size=2 where the case sets neither (a pipeline case keeps the base
TOML's batch: its schedule needs the microbatches), --training.steps N (a run that sets its
own steps, a resume's 20, gets it scaled: 20 -> 2N), and --job.dump_folder (one per case,
shared by its runs, as upstream's). Upstream's generation step is scripts/run_generate.sh on
the first run's last checkpoint, with upstream's prompt. As run_train.sh does, the config check runs first in one
process (torchtitan.checks): a case it refuses is reported with the check's one line. A case
that passes trains on `ngpu` ranks: forked from one process (tests/integration/fast_launch.py,
the same argv and environment) or, with --launcher torchrun, through run_train.sh itself.

Without --case: the cases `make test` runs (fast), with --slow every case upstream enables,
with --disabled also the 4 upstream disables. Results: trained (final loss of metrics.jsonl),
planned (upstream's memory estimation: our dry run, its predicted peak), refused (exit 2 and the check's one line), failed (the check broke, or a run exited non-zero:
the exit code and the last error line), not run (a tool this repository lacks).
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
import run_tests  # noqa: E402  (launch(), read_losses())
import upstream_cases  # noqa: E402
from upstream_cases import FT_ARGS, UPSTREAM_TOMLS, UpstreamCase, case_id  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
from torchtitan.config.manager import parse_cli  # noqa: E402  (torch-free)

DEFAULT_CONFIG = "tests/upstream/base_config.toml"
DEFAULT_TABLE = "docs/upstream_suite.md"
UPSTREAM_STEPS = 10  # the base TOML's training.steps: a run's own steps are scaled against it
SMALL = {"training.seq_len": "64", "training.local_batch_size": "2"}
GENERATE = os.path.join(ROOT, "scripts", "run_generate.sh")  # upstream: run_llama_generate.sh
PROMPT = "What is the meaning of life?"  # upstream's


@dataclass
class Result:
    case: UpstreamCase
    status: str  # trained | refused | failed | not run | disabled
    detail: str = ""  # the refusal or error line, or why it did not run
    loss: float | None = None
    appended: str = ""  # what the runs got besides the case's strings
    seconds: float = 0.0


def tokens(strings) -> list[str]:
    """Upstream's strings as its shell splits them, its TOML paths turned into our copies."""
    out = []
    for s in strings:
        for t in shlex.split(s):
            for theirs, ours in UPSTREAM_TOMLS.items():
                t = t.replace(theirs, ours)
            out.append(t)
    return out


def run_steps(args: list[str], steps: int) -> int:
    """The run's training.steps: N, or its own value scaled by N / UPSTREAM_STEPS."""
    own = [v for k, v in parse_cli(args)[0] if k == "training.steps"]
    return max(1, round(int(own[-1]) * steps / UPSTREAM_STEPS)) if own else steps


def run_args(case: UpstreamCase, index: int, steps: int, dump: str) -> tuple[list[str], list[str]]:
    """(the run's argv for run_train.sh, what was appended to upstream's strings)."""
    first = run_steps(tokens(case.runs[0].overrides), steps)
    strings = [s.format(dump=dump, steps=first) for s in case.runs[index].overrides]
    args = tokens(strings)
    if case.suite == "ft":
        args = [*FT_ARGS, *args]
    keys = {k for k, _ in parse_cli(args)[0]}
    # a pipeline splits the batch into microbatches (DualPipeV needs >= 4, a schedule CSV names
    # upstream's 8): keep the base TOML's batch there
    small = {k: v for k, v in SMALL.items() if k not in keys}
    if keys & {
        "parallelism.pipeline_parallel_degree",
        "parallelism.pipeline_parallel_schedule_csv",
    }:
        small.pop("training.local_batch_size", None)
    appended = [f"--{k}={v}" for k, v in small.items()]
    appended.append(f"--training.steps={run_steps(args, steps)}")
    if case.runs[index].tool == "estimate":  # upstream's memory estimation: our dry run
        appended.append("--job.dry_run=true")
    return [*args, *appended, f"--job.dump_folder={dump}"], appended


def last_error(text: str) -> str:
    """The line that says why: the last `error: ...` line, else the last exception line, else
    the last line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for pick in (
        lambda ln: ln.startswith("error:"),
        lambda ln: ln.split(":")[0].endswith(("Error", "Exception")),
    ):
        found = [ln for ln in lines if pick(ln)]
        if found:
            return found[-1][:400]
    return lines[-1][:400] if lines else ""


def check(config: str, ngpu: int, args: list[str]) -> tuple[int, str]:
    """run_train.sh's config check, before any rank starts: (exit code, its error line)."""
    env = {
        **os.environ,
        "NGPU": str(ngpu),
        "LOCAL_WORLD_SIZE": str(ngpu),
        "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    cmd = [sys.executable, "-m", "torchtitan.checks", "--job.config_file", config, *args]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    return proc.returncode, last_error(proc.stderr) if proc.returncode else ""


def generate(case: UpstreamCase, config: str, dump: str, appended: list[str]) -> tuple[str, str]:
    """Upstream's generation step: our scripts/run_generate.sh on the first run's last
    checkpoint, with upstream's prompt; (status, the line that says what happened)."""
    if not os.path.isfile(GENERATE):
        return "not run", "upstream generates text here; scripts/run_generate.sh is not there"
    steps = appended[-1].split("=")[1]
    env = {
        **os.environ,
        "NGPU": str(case.ngpu),
        "CONFIG_FILE": config,
        "CHECKPOINT_DIR": os.path.join(dump, "checkpoint", f"step-{steps}"),
        "PROMPT": PROMPT,
        "PYTHONPATH": ROOT,
    }
    report = os.path.join(dump, "generated_output.json")
    cmd = [GENERATE, f"--out={report}", *appended[:-1]]  # the model's shapes as trained
    try:
        proc = subprocess.run(
            cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=run_tests.TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return "failed", f"generation killed after {run_tests.TIMEOUT_S:.0f}s"
    if proc.returncode:
        status = "refused" if proc.returncode == 2 else "failed"
        return status, f"generate: {last_error(proc.stderr + proc.stdout)} (exit {proc.returncode})"
    return "trained", f"{os.path.basename(report)} written" if os.path.isfile(report) else "ok"


def run_case(case: UpstreamCase, config: str, steps: int, out: str, launcher: str | None) -> Result:
    """Every run of `case` in order (a later run resumes from the earlier's dump folder)."""
    dump = os.path.join(out, case_id(case).replace("/", "_"))
    result, start, notes = Result(case, "trained"), time.perf_counter(), []
    for i, run in enumerate(case.runs):
        where = f"run {i + 1} of {len(case.runs)}: " if len(case.runs) > 1 else ""
        args, appended = run_args(case, i, steps, dump)
        if run.tool == "generate":
            status, line = generate(case, config, dump, run_args(case, 0, steps, dump)[1])
            if status != "trained":
                result.status, result.detail = status, where + line
                break
            notes.append("generate: " + line)
            continue
        notes.append(" ".join(appended))
        rc, line = check(config, case.ngpu, args)
        if rc:  # 2: refused in one line; anything else: the check itself broke
            result.status = "refused" if rc == 2 else "failed"
            result.detail = f"{where}{line} (exit {rc})"
            break
        env, logs = {"CONFIG_FILE": config, "PYTHONPATH": ROOT}, os.path.join(dump, f"ranks{i + 1}")
        rc, _, console = run_tests.launch(case.ngpu, args, logs, env, launcher)
        if rc:
            tail = console + run_tests.rank_tails(logs)
            result.status, result.detail = "failed", f"{where}exit {rc}: {last_error(tail)}"
            break
        if run.tool == "estimate":  # a dry run plans the job and trains nothing
            result.status, result.detail = "planned", estimate_line(dump)
    if result.status == "trained":
        losses = read_losses(dump)
        result.loss = losses[-1] if losses else None
        if result.loss is None and not any(r.tool == "estimate" for r in case.runs):
            result.status, result.detail = "failed", "exit 0 but no loss in metrics.jsonl"
    result.appended = "; then ".join(dict.fromkeys(notes)) if notes else ""
    result.seconds = time.perf_counter() - start
    return result


def estimate_line(dump: str) -> str:
    """What a dry run predicted: the largest peak of its rank roles (plan.json)."""
    import json

    with open(os.path.join(dump, "plan.json")) as f:
        roles = json.load(f)["memory_per_rank_role"]
    peak = max(r["predicted_peak_bytes"] for r in roles) / 2**30
    return f"dry run: predicted peak {peak:.3f} GiB per rank ({len(roles)} rank role(s))"


def read_losses(dump: str) -> list[float]:
    path = os.path.join(dump, "metrics.jsonl")
    return run_tests.read_losses(dump) if os.path.exists(path) else []


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(results: list[Result], config: str, steps: int) -> str:
    """The markdown table of `results`."""
    counts = {
        s: sum(r.status == s for r in results) for s in dict.fromkeys(r.status for r in results)
    }
    lines = [
        "# Upstream torchtitan's integration suite, run here",
        "",
        f"Written by `python -m tests.integration.upstream_suite` (tests/integration/upstream_suite.py)"
        f" from the case table tests/integration/upstream_cases.py: upstream v0.2.2's"
        f" tests/integration_tests/{{features,models,h100,ft}}.py, on `{config}`, {steps} steps a run.",
        "Each run is upstream's command with the appended overrides shown (and --job.dump_folder);"
        " a refused case stopped at the config check run_train.sh runs before launching, with its one line.",
        "",
        "Results: "
        + ", ".join(f"{n} {s}" for s, n in counts.items())
        + f" of {len(results)} cases.",
        "",
        "| suite | case | ranks | result | final loss / refusal line | appended |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        what = f"{r.loss:.4f}" if r.loss is not None and math.isfinite(r.loss) else r.detail
        lines.append(
            f"| {r.case.suite} | {cell(r.case.name)} | {r.case.ngpu} | {r.status} | {cell(what)}"
            f" | {cell(r.appended)} |"
        )
    return "\n".join(lines) + "\n"


def selected(names: list[str], slow: bool, disabled: bool) -> list[UpstreamCase]:
    if names:
        known = {case_id(c): c for c in upstream_cases.CASES}
        missing = [n for n in names if n not in known]
        if missing:
            raise SystemExit(f"error: --case {missing[0]}: no such case; one of {', '.join(known)}")
        return [known[n] for n in names]
    return [
        c
        for c in upstream_cases.CASES
        if (c.fast or slow or disabled) and (disabled or not c.disabled)
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--case", action="append", default=[], help="a case name (repeatable)")
    ap.add_argument("--slow", action="store_true", help="every case upstream enables")
    ap.add_argument("--disabled", action="store_true", help="also the cases upstream disables")
    ap.add_argument("--steps", type=int, default=2, help="training steps a run (default 2)")
    ap.add_argument("--config", default=DEFAULT_CONFIG, help="the base TOML (default %(default)s)")
    ap.add_argument("--table", default="", help=f"write the table here (e.g. {DEFAULT_TABLE})")
    ap.add_argument("--launcher", choices=run_tests.LAUNCHERS, help="see run_tests.py")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds a run may take")
    ap.add_argument("--out", default="", help="folder for the runs (default: a temporary one)")
    args = ap.parse_args(argv)
    os.chdir(ROOT)  # upstream's relative paths (./tests/assets/...) are from the repository root
    run_tests.TIMEOUT_S = args.timeout
    out = args.out or tempfile.mkdtemp(prefix="titan_upstream_")
    results = []
    chosen = selected(args.case, args.slow, args.disabled)
    for case in upstream_cases.CASES if args.slow and not args.case else chosen:
        if case not in chosen:  # upstream's disabled cases, listed as such
            results.append(Result(case, "disabled", "disabled upstream (--disabled runs it)"))
            continue
        r = run_case(case, args.config, args.steps, out, args.launcher)
        results.append(r)
        what = f"{r.loss:.4f}" if r.loss is not None else r.detail
        print(
            f"{case_id(case):40s} {case.ngpu}  {r.status:8s} {r.seconds:6.1f}s  {what}", flush=True
        )
    text = table(results, args.config, args.steps)
    if args.table:
        with open(args.table, "w") as f:
            f.write(text)
        print(f"wrote {args.table}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
