"""The trainer's memory check before its first step (refuse what will not fit).

Rank 0 predicts every rank role's peak on a fake process group of the job's world size (the
dry run's simulation) in a child process started before it joins the job (a process cannot
hold the fake group and then the real one: device meshes and groups keep global state):
`start_prediction` hands the child the checked job config (pickled, nothing parsed again),
the child (the caller's command: the trainer's is `python -m torchtitan.predict_rank_roles`, an
entry point that owns the checks the suggestions need) runs `child_main` ->
`predict_at_startup` and hands back a StartupMemory (pickled), and
`share` gives it to every rank through the rendezvous store. Every rank learns its own role's
prediction (logged against the measured peak after step 2) and whether the job may start. A
role over the budget stops the job on every rank before the first step, unless
planning.allow_over_budget, with one line per offending role: the predicted GiB, the budget, and
changes that would fit, each with its predicted peak.

The same prediction times the step on the job's hardware profile (memory/step_time.py),
logged against the measured step time once the run has a few steps behind it. It runs
whenever there is a budget or a profile: `--planning.memory_budget_gib=none` (no budget)
on a CPU machine whose `local` profile was never measured skips it.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import timedelta

import torch.distributed as dist

from torchtitan.planning.memory.budget import memory_budget, ranks_on_this_node
from torchtitan.planning.memory.fit import Accepts, suggestions
from torchtitan.planning.memory.predict import RolePrediction, predict
from torchtitan.units import GIB


class MemoryBudgetError(RuntimeError):
    """A role's predicted peak exceeds the budget (raised alike on every rank)."""


@dataclass
class StartupMemory:
    roles: list[RolePrediction]
    budget_bytes: int | None
    budget_origin: str
    refusal: list[str] = field(default_factory=list)  # one line per offending role; [] = may start
    free_bytes: dict[int, int] = field(default_factory=dict)  # per pipeline rank, for reshard auto
    budget_note: str = ""
    hardware: str = ""  # the profile the step times are predicted on ("": none)

    def role_of(self, rank: int) -> RolePrediction | None:
        return next((r for r in self.roles if rank in r.ranks), None)


def wanted(cfg, device_type: str) -> bool:
    """Whether a job gets the start-up prediction (every rank decides alike)."""
    from torchtitan.planning.step_time.local_profile import job_hardware

    return (
        cfg.planning.memory_budget_gib != "none"
        or cfg.memory_estimation.enable
        or job_hardware(cfg, device_type, measure=False) is not None
    )


def estimate_lines(startup: StartupMemory) -> list[str]:
    """[memory_estimation] enable: every rank role's predicted peak, logged by rank 0 before
    the first step (upstream's memory estimation, answered by this fork's prediction)."""
    lines = []
    for r in startup.roles:
        parts = ", ".join(f"{k} {v / GIB:.3f}" for k, v in r.breakdown.items() if v)
        lines.append(
            f"[torchtitan] memory estimation: role {r.role} (ranks {_ranks(r.ranks)}): predicted"
            f" peak {r.predicted_peak_bytes / GIB:.3f} GiB at {r.peak_at} ({parts} GiB)"
        )
    return lines


def start_prediction(
    cfg, world: int, device_type: str, command: list[str]
) -> subprocess.Popen | None:
    """Rank 0 starts the prediction (a child process on a fake process group) before it joins
    the job, so it runs while the ranks rendezvous and build; `share` collects it. `command`:
    the child to run, one that calls child_main."""
    if not wanted(cfg, device_type):
        return None
    env = dict(os.environ)
    for key in (
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCHELASTIC_RUN_ID",
        "GROUP_RANK",
    ):
        env.pop(key, None)
    child = subprocess.Popen(
        command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    child.stdin.write(pickle.dumps((cfg, world, device_type)))  # a few kB: within the pipe's buffer
    child.stdin.close()
    child.stdin = None  # communicate() must not flush it again
    return child


def predict_at_startup(cfg, world: int, device_type: str, accepts: Accepts) -> StartupMemory:
    """Every role's peak, the budget, and (over it) the refusal lines with what would fit.
    Joins a fake process group of `world` ranks for the time it takes."""
    from torchtitan.planning.step_time.local_profile import job_hardware
    from torchtitan.training.build import fake_world
    from torchtitan.training.planned_job import PlannedJob, model_on_meta

    budget = memory_budget(cfg, ranks_on_this_node(world), started_rank=True)
    hardware = job_hardware(cfg, device_type, measure=False)
    with fake_world(cfg, world) as dims:
        job = PlannedJob(cfg, model_on_meta(cfg), dims, device_type)
        prediction = predict(job, None if budget is None else budget.bytes, hardware)
        roles = prediction.roles
        out = StartupMemory(
            roles,
            None if budget is None else budget.bytes,
            "" if budget is None else budget.origin,
            free_bytes=prediction.free_bytes,
            budget_note=prediction.budget_note,
            hardware="" if hardware is None else hardware.name,
        )
        over = [r for r in roles if budget is not None and r.predicted_peak_bytes > budget.bytes]
        if over and not cfg.planning.allow_over_budget:
            fixes = suggestions(job, budget.bytes, accepts)
            hint = (
                "; would fit: " + ", ".join(fixes)
                if fixes
                else "; nothing tried fits: use more ranks or sharding"
            )
            for r in over:
                out.refusal.append(
                    f"role {r.role} (ranks {_ranks(r.ranks)}): predicted peak {r.predicted_peak_bytes / GIB:.2f} GiB"
                    f" > memory budget {budget.bytes / GIB:.2f} GiB ({budget.origin}){hint};"
                    " or --planning.allow_over_budget=true to start anyway"
                )
        return out


def _ranks(ranks: list[int]) -> str:
    return (
        f"{ranks[0]}-{ranks[-1]}"
        if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1))
        else ",".join(map(str, ranks))
    )


def child_main(accepts_for) -> None:
    """The child's side: the pickled (cfg, world, device type) on stdin -> the pickled
    StartupMemory (or the failure's text) on stdout; everything the prediction prints goes to
    stderr. `accepts_for(world)`: the checks a candidate job must pass."""
    result = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # prints (warnings, libraries) must not mix with the result
    sys.stdout = sys.stderr
    cfg, world, device_type = pickle.loads(sys.stdin.buffer.read())
    out = predict_at_startup(cfg, world, device_type, accepts_for(world))
    result.write(pickle.dumps(out))
    result.close()


def _collect(child: subprocess.Popen) -> bytes:
    out, err = child.communicate()
    if child.returncode != 0:
        tail = "\n".join(err.decode(errors="replace").strip().splitlines()[-12:])
        return pickle.dumps(
            f"the start-up memory prediction failed (exit {child.returncode}):\n{tail}"
        )
    return out


_STORE_KEY = "torchtitan/memory_prediction"
PREDICTION_TIMEOUT = timedelta(hours=2)  # how long the other ranks wait for rank 0's prediction


def share(child: subprocess.Popen | None) -> StartupMemory:
    """Rank 0's prediction to every rank, through the rendezvous store (a store wait, not a
    collective: the prediction may take longer than --comm.timeout_seconds)."""
    store = dist.distributed_c10d._get_default_store()
    if dist.get_rank() == 0:
        store.set(_STORE_KEY, _collect(child))
    else:
        store.wait([_STORE_KEY], PREDICTION_TIMEOUT)
    result = pickle.loads(store.get(_STORE_KEY))
    if isinstance(result, str):
        raise RuntimeError(result)
    return result
