#!/usr/bin/env python3
"""Publish the error of the memory prediction: predicted vs measured peak per rank role.

    python scripts/memory_check.py                      # the whole matrix, 3 runs per job
    python scripts/memory_check.py --filter pp_ --runs 1
    python scripts/memory_check.py --list               # the matrix, overrides expanded
    python scripts/memory_check.py --predict-only       # dry runs only: the predictions
    python scripts/memory_check.py --filter ds_ --breakdown  # + predicted bytes by category
    python scripts/memory_check.py --json rows.json --launcher torchrun --timeout 900
    python scripts/memory_check.py --from-json rows.json  # the table of an earlier run again

Each job of MATRIX (below) is a real CPU job (gloo, up to 8 ranks) on the debug Llama3 or
DeepSeek-V3 for 3 steps at seq_len 128, run through run_train.sh's argv and environment.

What is compared with what
- PREDICTED: `--job.dry_run=true` with the same NGPU and overrides (one process, fake
  process group) writes <dump>/plan.json; its `memory_per_rank_role` records give, per rank
  role (a set of ranks with the same layout), `predicted_peak_bytes`: the peak of allocated
  tensor bytes over one training step. For MoE jobs that is the figure for a balanced
  routing load; `worst_case_peak_bytes` (every routed token copy on one expert-parallel rank)
  is printed beside it but not compared.
- MEASURED: the same job with `--metrics.cpu_memory_peak=true`: every rank writes
  <dump>/memory/rank<r>.jsonl, one {"step", "peak_allocated_bytes"} line per step (the
  torch profiler's allocator counter plus a census of the storages alive before the first
  step: the CPU analogue of torch.cuda.max_memory_allocated). A run's peak of a rank is the
  max over steps >= 2 (step 1 builds lazily: optimizer states, pipeline shape inference).
  Each job runs --runs times (default 3), a fresh dump folder each; a rank's measured peak
  is the MEDIAN over the runs, a role's the MAX over its ranks of those medians; the spread
  is max - min over the runs (per rank, and for a role the largest of its ranks').
- ERROR = (predicted - measured) / measured per role: + means the prediction is too high.
  Like is compared with like for MoE: a measured run routes as its (freshly initialised,
  bias-balanced) router happens to, near balance, so it is held against the balanced
  prediction; a measured peak above the worst-case bound is flagged (it would be a miss no
  routing explains).
- The summary line: worst |error| over all roles, median |error| over the roles of the
  matrix, how many roles are within +/-10%, and the failed jobs (never dropped silently).

What is not counted on either side: allocator fragmentation and caching (CPU has no caching
allocator; on CUDA reserved - allocated), NCCL's own buffers, and memory outside tensors (the
interpreter, libraries, gloo's transport buffers). What the meter sees and the prediction
leaves out (docs/memory.md, "Not counted"): gloo's own temporaries of a collective, which are CPU
allocator blocks. Observed over the whole matrix (3 runs each, 2026-12-01): every role
within +/-5%, nearly all below the prediction; a constant ~1 KiB above it in almost every
job (the meter's own probe allocations, presumably); FSDP2 with resharding about 0.75 MiB
above it at 2 and 4 ranks and 1.5 MiB at 8 (none with reshard never, SimpleFSDP or DDP: gloo's
temporaries, most likely), sometimes 2 MiB more in single runs (when a collective's buffer
happens to overlap the peak: the only run-to-run spread, with EP's all-to-alls); pipeline
jobs a few 128 KiB microbatch boundary tensors above it (28-31 of them for Interleaved1F1B
at 8 microbatches, -4.3%, the worst role).

A job that fails (dry run or any real run: exit code, timeout, missing or unreadable output)
prints its last lines and counts as failed. A real run's plan (plan.json's model_parts) that
differs from the dry run's is reported: the two would not describe the same job.

Launchers: `fast` (default) forks each run's ranks from one process that imported torch and
torchtitan once (tests/integration/fast_launch.py; the same argv and environment as
run_train.sh), `torchrun` runs ./run_train.sh itself.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN_TRAIN = os.path.join(ROOT, "run_train.sh")
FAST_LAUNCH_DIR = os.path.join(ROOT, "tests", "integration")
MIB = 2**20

MOE_MODELS = {"deepseek_v3", "qwen3_moe"}  # a worst-routing bound beside the balanced prediction
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from memory_check_matrix import (  # noqa: E402, F401  (the matrix: its own module, re-exported here)
    AC_PRESETS,
    BASE,
    CONFIGS,
    DEFAULTS,
    KEYS,
    MATRIX,
    MODEL_OF_PREFIX,
    REQUIRED_TAGS,
    Job,
    Shape,
    parse_matrix,
    parse_settings,
    shape,
    tags,
)

MEASURE = "--metrics.cpu_memory_peak=true"
DRY_RUN = "--job.dry_run=true"
FIRST_MEASURED_STEP = 2  # step 1 builds lazily
WITHIN = 0.10  # the summary counts roles whose |error| is at most this


class CheckError(Exception):
    """A job's outputs cannot be read as this check needs them; the text says what and where."""


# ---------------------------------------------------------------- predictions (plan.json)


@dataclass
class Role:
    role: str
    ranks: list[int]
    predicted: int
    worst_case: int
    peak_at: str
    breakdown: dict[str, int] = field(default_factory=dict)


ROLE_FIELDS = {
    "role": str,
    "ranks": list,
    "predicted_peak_bytes": int,
    "worst_case_peak_bytes": int,
    "peak_at": str,
    "breakdown": dict,
}


def parse_roles(plan: dict, world: int, where: str = "plan.json") -> list[Role]:
    """plan.json's memory_per_rank_role records; every rank 0..world-1 in exactly one."""
    records = plan.get("memory_per_rank_role")
    if records is None:
        raise CheckError(
            f"{where} has no 'memory_per_rank_role' (keys: {', '.join(sorted(plan)) or 'none'}):"
            " this checkout's dry run predates the per-role memory prediction"
        )
    if not isinstance(records, list) or not records:
        raise CheckError(f"{where}: 'memory_per_rank_role' must be a non-empty list of records")
    roles, owner = [], {}
    for i, rec in enumerate(records):
        label = f"{where}: memory_per_rank_role[{i}]"
        if not isinstance(rec, dict):
            raise CheckError(f"{label} is not a record")
        for key, kind in ROLE_FIELDS.items():
            value = rec.get(key)
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise CheckError(
                    f"{label} ({rec.get('role', '?')}): '{key}' missing or not {kind.__name__}"
                )
        for r in rec["ranks"]:
            if not isinstance(r, int) or isinstance(r, bool) or not 0 <= r < world:
                raise CheckError(
                    f"{label} ({rec['role']}): rank {r!r} outside 0..{world - 1} (world {world})"
                )
            if r in owner:
                raise CheckError(
                    f"{where}: rank {r} is in two role records, '{owner[r]}' and '{rec['role']}'"
                )
            owner[r] = rec["role"]
        roles.append(
            Role(
                rec["role"],
                sorted(rec["ranks"]),
                rec["predicted_peak_bytes"],
                rec["worst_case_peak_bytes"],
                rec["peak_at"],
                {str(k): int(v) for k, v in rec["breakdown"].items()},
            )
        )
    missing = [r for r in range(world) if r not in owner]
    if missing:
        raise CheckError(
            f"{where}: rank(s) {', '.join(map(str, missing))} in no memory_per_rank_role record"
            f" (world {world})"
        )
    return roles


def load_json(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise CheckError(f"{path} was not written") from None
    except (OSError, ValueError) as e:
        raise CheckError(f"{path}: cannot read it as JSON ({e})") from None


def plan_difference(dry: dict, run: dict) -> str:
    """Where a real run's plan (the model parts it wrote) differs from the dry run's; "" if nowhere."""
    dry_parts = {json.dumps(p.get("stage")): p for p in dry.get("model_parts", [])}
    for part in run.get("model_parts", []):
        key = json.dumps(part.get("stage"))
        if key not in dry_parts:
            return f"stage {key} is in the run's plan.json, not in the dry run's"
        if dry_parts[key] != part:
            return f"stage {key}: the run's FSDP units / decisions differ from the dry run's"
    return ""


# ---------------------------------------------------------------- measurements (memory/rank<r>.jsonl)


def rank_peak(path: str, first_step: int = FIRST_MEASURED_STEP) -> int:
    """A run's peak for one rank: max of peak_allocated_bytes over steps >= first_step."""
    try:
        with open(path) as f:
            lines = [ln for ln in f if ln.strip()]
    except FileNotFoundError:
        raise CheckError(
            f"{path} was not written (was --metrics.cpu_memory_peak honoured?)"
        ) from None
    peaks = []
    for n, line in enumerate(lines, 1):
        try:
            rec = json.loads(line)
            step, peak = int(rec["step"]), int(rec["peak_allocated_bytes"])
        except (ValueError, KeyError, TypeError) as e:
            raise CheckError(
                f"{path} line {n}: not a {{step, peak_allocated_bytes}} record ({e})"
            ) from None
        if step >= first_step:
            peaks.append(peak)
    if not peaks:
        raise CheckError(
            f"{path}: no step >= {first_step} (the first step builds lazily and is not counted)"
        )
    return max(peaks)


def busiest_expert(metrics_path: str, first_step: int = FIRST_MEASURED_STEP) -> float | None:
    """MoE runs: the largest expert_load_max (busiest expert's tokens / the mean) over steps >=
    first_step in metrics.jsonl; None without MoE metrics. How far from balance a run routed."""
    try:
        with open(metrics_path) as f:
            records = [json.loads(ln) for ln in f if ln.strip()]
    except (OSError, ValueError):
        return None
    loads = [
        r["expert_load_max"]
        for r in records
        if isinstance(r.get("expert_load_max"), (int, float)) and r.get("step", 0) >= first_step
    ]
    return max(loads) if loads else None


def run_peaks(dump: str, world: int) -> list[int]:
    """One run's peak per rank."""
    return [rank_peak(os.path.join(dump, "memory", f"rank{r}.jsonl")) for r in range(world)]


@dataclass
class RankRow:
    job: str
    rank: int
    role: str
    runs: list[int]
    measured: float  # median over the runs
    spread: int  # max - min over the runs
    predicted: int | None
    error: float | None


@dataclass
class RoleRow:
    job: str
    role: str
    ranks: list[int]
    predicted: int | None
    worst_case: int | None
    measured: float  # max over the ranks of their medians
    spread: int  # largest spread of its ranks
    error: float | None
    peak_at: str = ""
    breakdown: dict[str, int] = field(default_factory=dict)
    above_worst_case: bool = False


def rel_error(predicted: float, measured: float) -> float:
    """(predicted - measured) / measured: + means predicted too high."""
    if measured <= 0:
        raise CheckError(f"measured peak {measured} <= 0: the meter reported nothing")
    return (predicted - measured) / measured


def rank_rows(job: str, runs: list[list[int]], roles: list[Role] | None) -> list[RankRow]:
    """runs[i][r]: run i's peak of rank r -> one row per rank (median, spread, error)."""
    world = len(runs[0])
    if any(len(r) != world for r in runs):
        raise CheckError(f"{job}: runs report different numbers of ranks")
    role_of = {r: role for role in roles or [] for r in role.ranks}
    rows = []
    for r in range(world):
        values = [run[r] for run in runs]
        med = statistics.median(values)
        role = role_of.get(r)
        rows.append(
            RankRow(
                job,
                r,
                role.role if role else "?",
                values,
                med,
                max(values) - min(values),
                role.predicted if role else None,
                rel_error(role.predicted, med) if role else None,
            )
        )
    return rows


def role_rows(
    job: str, ranks: list[RankRow], roles: list[Role], moe: bool = False
) -> list[RoleRow]:
    """A role's measured peak is the max over its ranks of their medians; with experts (moe)
    a measured peak above the worst-routing bound is flagged where there is such a bound (the
    worst case above the balanced figure: expert parallelism, whose routing moves tokens
    between ranks; without it every rank holds every expert and the two figures are equal)."""
    out = []
    for role in roles:
        mine = [ranks[r] for r in role.ranks]
        measured = max(row.measured for row in mine)
        out.append(
            RoleRow(
                job,
                role.role,
                role.ranks,
                role.predicted,
                role.worst_case,
                measured,
                max(row.spread for row in mine),
                rel_error(role.predicted, measured),
                role.peak_at,
                role.breakdown,
                above_worst_case=moe and role.predicted < role.worst_case < measured,
            )
        )
    return out


def summarize(roles: list[RoleRow], n_jobs: int, failed: list[str]) -> dict:
    """worst |error| over the roles, median |error| over the matrix, roles within +/-WITHIN."""
    errors = [(abs(r.error), r) for r in roles if r.error is not None]
    worst = max(errors, key=lambda e: e[0]) if errors else None
    return {
        "jobs": n_jobs,
        "failed": failed,
        "roles": len(errors),
        "worst_abs_error": worst[0] if worst else None,
        "worst_role": f"{worst[1].job}/{worst[1].role}" if worst else None,
        "median_abs_error": statistics.median(e for e, _ in errors) if errors else None,
        "within": WITHIN,
        "roles_within": sum(e <= WITHIN for e, _ in errors),
        "roles_above_worst_case": [f"{r.job}/{r.role}" for r in roles if r.above_worst_case],
    }


def summary_line(s: dict) -> str:
    if not s["roles"]:
        text = "summary: no role compared"
    else:
        text = (
            f"summary: worst |error| {100 * s['worst_abs_error']:.1f}% ({s['worst_role']}),"
            f" median |error| {100 * s['median_abs_error']:.1f}% over {s['roles']} roles,"
            f" {s['roles_within']}/{s['roles']} roles within +/-{100 * s['within']:.0f}%"
        )
    text += f"; {s['jobs'] - len(s['failed'])}/{s['jobs']} jobs ok"
    if s["failed"]:
        text += f", {len(s['failed'])} failed: {', '.join(s['failed'])}"
    if s["roles_above_worst_case"]:
        text += f"; measured above the worst-case bound: {', '.join(s['roles_above_worst_case'])}"
    return text


# ---------------------------------------------------------------- output


def mib(n: float | None) -> str:
    return "-" if n is None else f"{n / MIB:.2f}"


def pct(e: float | None) -> str:
    return "-" if e is None else f"{100 * e:+.2f}%"


def breakdown_text(breakdown: dict[str, int]) -> str:
    """The predicted MiB by category, zeros left out."""
    return ", ".join(f"{k} {mib(v)}" for k, v in breakdown.items() if v) or "no breakdown"


def ranks_text(ranks: list[int]) -> str:
    if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))


HEADER = (
    f"{'job':44s} {'rank':>4s} {'role':18s} {'predicted':>10s} {'worst':>10s} {'measured':>10s}"
    f" {'error':>8s} {'spread':>7s}"
)


def rank_line(job: Job, row: RankRow, worst: int | None) -> str:
    wc = mib(worst) if job.model in MOE_MODELS else "-"
    return (
        f"{job.name:44s} {row.rank:>4d} {row.role[:18]:18s} {mib(row.predicted):>10s} {wc:>10s}"
        f" {mib(row.measured):>10s} {pct(row.error):>8s} {mib(row.spread):>7s}"
    )


def role_line(job: Job, row: RoleRow, breakdown: bool = False) -> str:
    text = (
        f"  role {row.role} (ranks {ranks_text(row.ranks)}): predicted {mib(row.predicted)} MiB"
        + (f" (worst case {mib(row.worst_case)})" if job.model in MOE_MODELS else "")
        + f" vs measured {mib(row.measured)} MiB: error {pct(row.error)}"
        + (
            f" ({(row.predicted - row.measured) / 2**10:+,.1f} KiB)"
            if row.predicted is not None
            else ""
        )
        + f", spread {mib(row.spread)} MiB"
    )
    if row.peak_at:
        text += f", predicted peak at {row.peak_at}"
    if row.above_worst_case:
        text += "  ** measured above the worst-case bound **"
    if breakdown and row.breakdown:
        text += "\n    predicted: " + breakdown_text(row.breakdown)
    return text


# ---------------------------------------------------------------- running jobs


def tail_lines(text: str, n: int = 15) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return "\n".join("    " + ln for ln in lines[-n:])


def rank_log_tails(log_dir: str, n: int = 8) -> str:
    """The last lines of every rank's stdout.log / stderr.log under log_dir."""
    out = []
    for root, _, files in sorted(os.walk(log_dir)):
        for name in sorted(f for f in files if f in ("stdout.log", "stderr.log")):
            with open(os.path.join(root, name), errors="replace") as f:
                text = f.read()
            if text.strip():
                out.append(
                    f"  --- {os.path.relpath(os.path.join(root, name), log_dir)}:\n{tail_lines(text, n)}"
                )
    return "\n".join(out)


class Launcher:
    """Runs run_train.sh's job (argv + environment) with the fast fork-server launcher or torchrun."""

    def __init__(self, name: str, timeout: float):
        self.name, self.timeout = name, timeout
        self.fast = None
        if name == "fast":
            if FAST_LAUNCH_DIR not in sys.path:
                sys.path.insert(0, FAST_LAUNCH_DIR)
            import fast_launch

            self.fast = fast_launch
            fast_launch.start()  # the fork server imports torchtitan while the first dry run is prepared

    def run(self, job: Job, args: list[str], log_dir: str, dry_run: bool) -> tuple[int, str]:
        """(exit code, console and, on failure, every rank's last lines); 124 = timed out."""
        env = {**os.environ, "NGPU": str(job.ngpu), "CONFIG_FILE": job.config_file, "LOG_RANK": "0"}
        os.makedirs(log_dir, exist_ok=True)
        if self.fast is not None and not self.fast.needs_torchrun(env):
            rc, out = self.fast.launch(job.ngpu, args, log_dir, env, self.timeout, dry_run=dry_run)
        else:
            if not dry_run:
                env["TORCHRUN_LOG_DIR"] = log_dir
            proc = subprocess.Popen(
                [RUN_TRAIN, *args],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
            try:
                out, _ = proc.communicate(timeout=self.timeout)
                rc = proc.returncode
            except subprocess.TimeoutExpired:
                if FAST_LAUNCH_DIR not in sys.path:
                    sys.path.insert(0, FAST_LAUNCH_DIR)
                import run_tests  # the launcher and the ranks run outside run_train.sh's process group

                run_tests.kill_tree(proc.pid)
                out, _ = proc.communicate()
                rc = 124
        if rc == 124:
            out += f"\n[memory_check] killed after {self.timeout:.0f}s (--timeout)\n"
        if rc != 0:
            out = f"{tail_lines(out, 6)}\n{rank_log_tails(log_dir)}"
        return rc, out


@dataclass
class JobResult:
    name: str
    ngpu: int
    model: str
    overrides: list[str]
    ok: bool = False
    errors: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    ranks: list[RankRow] = field(default_factory=list)
    roles: list[RoleRow] = field(default_factory=list)
    predicted_roles: list[Role] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    busiest_expert: list[float] = field(default_factory=list)  # per run (MoE)


def predict(job: Job, launcher: Launcher, out: str) -> tuple[list[Role] | None, dict, str, int]:
    """The dry run: (roles or None, plan, error text, exit code)."""
    dump = os.path.join(out, job.name, "dry_run")
    rc, log = launcher.run(
        job,
        [*job.overrides(), DRY_RUN, f"--job.dump_folder={dump}"],
        os.path.join(dump, "logs"),
        dry_run=True,
    )
    if rc != 0:
        return None, {}, f"dry run exit {rc}:\n{log}", rc
    try:
        plan = load_json(os.path.join(dump, "plan.json"))
        return parse_roles(plan, job.ngpu, where=os.path.join(dump, "plan.json")), plan, "", 0
    except CheckError as e:
        return None, {}, f"dry run: {e}", 0


def measure(job: Job, launcher: Launcher, out: str, run: int) -> tuple[list[int] | None, dict, str]:
    """One real run: (peak per rank or None, its plan.json or {}, error text)."""
    dump = os.path.join(out, job.name, f"run{run}")
    rc, log = launcher.run(
        job,
        [*job.overrides(), MEASURE, f"--job.dump_folder={dump}"],
        os.path.join(dump, "logs"),
        dry_run=False,
    )
    if rc != 0:
        return None, {}, f"run {run} exit {rc}:\n{log}"
    try:
        peaks = run_peaks(dump, job.ngpu)
    except CheckError as e:
        return None, {}, f"run {run}: {e}"
    try:
        plan = load_json(os.path.join(dump, "plan.json"))
    except CheckError:
        plan = {}
    return peaks, plan, ""


def check_job(job: Job, launcher: Launcher, out: str, runs: int, predict_only: bool) -> JobResult:
    res = JobResult(job.name, job.ngpu, job.model, job.overrides())
    start = time.monotonic()
    shutil.rmtree(
        os.path.join(out, job.name), ignore_errors=True
    )  # fresh dump folders (rank files append)
    roles, dry_plan, err, rc = predict(job, launcher, out)
    if err:
        res.errors.append(err)
    if roles:
        res.predicted_roles = roles
    if predict_only or rc == 2:  # 2: the config was refused, a real run would be too
        if rc == 2:
            res.errors.append("real runs not started: the configuration was refused")
        res.ok, res.wall_s = not res.errors, time.monotonic() - start
        return res
    measured = []
    for i in range(1, runs + 1):
        peaks, plan, err = measure(job, launcher, out, i)
        if err:
            res.errors.append(err)
            break
        measured.append(peaks)
        load = busiest_expert(os.path.join(out, job.name, f"run{i}", "metrics.jsonl"))
        if load is not None:
            res.busiest_expert.append(load)
        if i == 1 and dry_plan and plan and (diff := plan_difference(dry_plan, plan)):
            res.notes.append(f"plan differs from the dry run's: {diff}")
    if measured and len(measured) == runs:
        try:
            res.ranks = rank_rows(job.name, measured, roles)
            if roles:
                res.roles = role_rows(job.name, res.ranks, roles, moe=job.model in MOE_MODELS)
        except CheckError as e:
            res.errors.append(str(e))
    res.ok, res.wall_s = not res.errors, time.monotonic() - start
    return res


def print_result(job: Job, res: JobResult, breakdown: bool = False) -> None:
    worst = {r: role.worst_case for role in res.predicted_roles for r in role.ranks}
    if res.ranks:
        for row in res.ranks:
            print(rank_line(job, row, worst.get(row.rank)))
        for row in res.roles:
            print(role_line(job, row, breakdown))
    elif res.predicted_roles:  # predictions only
        for role in res.predicted_roles:
            wc = f" (worst case {mib(role.worst_case)})" if job.model in MOE_MODELS else ""
            print(
                f"{job.name:44s} role {role.role} (ranks {ranks_text(role.ranks)}): predicted"
                f" {mib(role.predicted)} MiB{wc} at {role.peak_at}; "
                + breakdown_text(role.breakdown)
            )
    for note in res.notes:
        print(f"  note: {note}")
    if res.errors:
        print(f"{job.name:44s} FAILED ({res.wall_s:.0f}s)")
        for e in res.errors:
            print("  " + e.replace("\n", "\n  "))
    else:
        routing = ""
        if res.busiest_expert:
            routing = (
                f"; routing: busiest expert {statistics.median(res.busiest_expert):.2f}x the mean load"
                " (steps >= 2, median of the runs)"
            )
        print(f"  ({job.name}: {res.wall_s:.0f}s{routing})")
    sys.stdout.flush()


def results_from_json(data: dict) -> list[tuple[Job, JobResult]]:
    """The jobs of a --json file, role rows recomputed from its rank rows and predictions."""
    out = []
    for j in data["jobs"]:
        job = Job(j["name"], j["ngpu"], j["model"], ())
        res = JobResult(
            j["name"],
            j["ngpu"],
            j["model"],
            j["overrides"],
            j["ok"],
            j["errors"],
            j["wall_s"],
            [RankRow(**r) for r in j["ranks"]],
            [],
            [Role(**r) for r in j["predicted_roles"]],
            j["notes"],
            j.get("busiest_expert", []),
        )
        if res.ranks and res.predicted_roles:
            res.roles = role_rows(
                job.name, res.ranks, res.predicted_roles, moe=job.model in MOE_MODELS
            )
        out.append((job, res))
    return out


def print_header(n_jobs: int, runs: int, launcher: str, where: str) -> None:
    print(f"{n_jobs} jobs, {runs} run(s) each, launcher {launcher}, {where}")
    print(
        "sizes in MiB. predicted: the dry run's peak of the rank's role; worst: MoE worst-routing bound (printed,"
        " not compared); measured: median over the runs of max over steps >= 2; error = (predicted - measured) /"
        " measured; spread = max - min over the runs. Role lines: measured = max over the role's ranks."
    )
    print(HEADER, flush=True)


def report(path: str, breakdown: bool) -> int:
    """--from-json: the table and summary of an earlier --json file, without running anything."""
    with open(path) as f:
        data = json.load(f)
    pairs = results_from_json(data)
    print_header(len(pairs), data["runs_per_job"], data["launcher"], f"read from {path}")
    for job, res in pairs:
        print_result(job, res, breakdown)
    failed = [r.name for _, r in pairs if not r.ok]
    summary = summarize([row for _, r in pairs for row in r.roles], len(pairs), failed)
    wall = data.get("summary", {}).get("wall_s")
    print(summary_line(summary) + (f"  ({wall:.0f}s)" if wall is not None else ""))
    return 1 if failed else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--filter", default="", help="only jobs whose name contains this")
    ap.add_argument(
        "--runs", type=int, default=3, help="real runs per job (median per rank; default 3)"
    )
    ap.add_argument(
        "--json", default="", help="write every row (ranks, roles, failures, summary) to this file"
    )
    ap.add_argument(
        "--launcher",
        choices=("fast", "torchrun"),
        default="fast",
        help="fast: ranks forked from one preloaded process (default); torchrun: run_train.sh",
    )
    ap.add_argument(
        "--timeout", type=float, default=600.0, help="seconds one run may take (default 600)"
    )
    ap.add_argument(
        "--out",
        default="",
        help="folder for the runs' dump folders, <out>/<job>/{dry_run,run1,...}, each job's replaced"
        " (default: a new temporary folder)",
    )
    ap.add_argument(
        "--list", action="store_true", help="print the matrix (overrides expanded) and exit"
    )
    ap.add_argument(
        "--predict-only", action="store_true", help="dry runs only: print the predictions"
    )
    ap.add_argument(
        "--breakdown", action="store_true", help="print each role's predicted bytes by category"
    )
    ap.add_argument(
        "--from-json",
        default="",
        metavar="FILE",
        help="print the table and summary of an earlier --json file (no runs)",
    )
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be >= 1")
    if args.from_json:
        return report(args.from_json, args.breakdown)
    jobs = [j for j in parse_matrix() if args.filter in j.name]
    if not jobs:
        print(f"error: no job name contains '{args.filter}'", file=sys.stderr)
        return 2
    if args.list:
        for j in jobs:
            print(
                f"{j.name:44s} {j.ngpu}  CONFIG_FILE={CONFIGS[j.model]}  {shlex.join(j.overrides())}"
            )
        return 0
    out = args.out or tempfile.mkdtemp(prefix="memory_check_")
    launcher = Launcher(args.launcher, args.timeout)
    print_header(len(jobs), args.runs, args.launcher, f"dump folders in {out}")
    results, start = [], time.monotonic()
    for job in jobs:
        res = check_job(job, launcher, out, args.runs, args.predict_only)
        print_result(job, res, args.breakdown)
        results.append(res)
    failed = [r.name for r in results if not r.ok]
    summary = summarize([row for r in results for row in r.roles], len(results), failed)
    summary["wall_s"] = time.monotonic() - start
    print(summary_line(summary) + f"  ({summary['wall_s']:.0f}s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "runs_per_job": args.runs,
                    "launcher": args.launcher,
                    "jobs": [asdict(r) for r in results],
                    "summary": summary,
                },
                f,
                indent=1,
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
