"""The trainer's memory check before its first step (issue: refuse what will not fit).

Rank 0, before it joins the job's process group, predicts every rank role's peak on a fake
process group of the job's world size (the dry run's simulation), in a child process (a
process cannot hold the fake group and then the real one: device meshes and groups keep
global state), then shares the result;
every rank learns its own role's prediction (logged against the measured peak after step 2)
and whether the job may start. A role over the budget stops the job on every rank before
the first step, unless job.allow_over_budget, with one line per offending role: the
predicted GiB, the budget, and changes that would fit, each with its predicted peak.

`--parallelism.memory_budget_gib=-1` (no budget) skips the prediction.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field

import torch.distributed as dist

from torchtitan.config.memory_budget import memory_budget, ranks_on_this_node
from torchtitan.memory.predict import GIB, RolePrediction


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

    def role_of(self, rank: int) -> RolePrediction | None:
        return next((r for r in self.roles if rank in r.ranks), None)


def predict_before_start(argv: list[str], cfg, world: int, device_type: str) -> StartupMemory | None:
    """Rank 0's prediction, made by a child process on a fake process group."""
    if cfg.parallelism.memory_budget_gib == -1:
        return None
    env = {**os.environ, "WORLD_SIZE": str(world), "TITAN_PREDICT_DEVICE": device_type}
    for key in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "GROUP_RANK"):
        env.pop(key, None)
    child = subprocess.run([sys.executable, "-m", "torchtitan.memory.startup", *argv], env=env,
                           capture_output=True, text=True)
    if child.returncode != 0:
        tail = "\n".join((child.stdout + child.stderr).strip().splitlines()[-12:])
        raise RuntimeError(f"the start-up memory prediction failed (exit {child.returncode}):\n{tail}")
    data = json.loads(child.stdout.strip().splitlines()[-1])
    roles = [RolePrediction(r["role"], r["ranks"], r["pp_rank"], r["stages"], r["predicted_peak_bytes"],
                            r["worst_case_peak_bytes"], r["peak_at"], r["breakdown"]) for r in data["roles"]]
    return StartupMemory(roles, data["budget_bytes"], data["budget_origin"], data["refusal"],
                         {int(k): v for k, v in data["free_bytes"].items()}, data["budget_note"])


def _predict(cfg, world: int, device_type: str) -> StartupMemory:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.dry_run import build_model
    from torchtitan.memory.fit import suggestions
    from torchtitan.memory.predict import predict

    budget = memory_budget(cfg, ranks_on_this_node(world), started_rank=True)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        dims = ParallelDims.from_config(cfg, world)
        dims.build_mesh("cpu")
        spec, model, args = build_model(cfg)
        prediction = predict(spec, model, dims, cfg, device_type, args, None if budget is None else budget.bytes)
        roles = prediction.roles
        out = StartupMemory(roles, None if budget is None else budget.bytes, "" if budget is None else budget.origin,
                            free_bytes=prediction.free_bytes, budget_note=prediction.budget_note)
        over = [r for r in roles if budget is not None and r.predicted_peak_bytes > budget.bytes]
        if over and not cfg.job.allow_over_budget:
            fixes = suggestions(spec, model, dims, cfg, device_type, args, budget.bytes)
            hint = "; would fit: " + ", ".join(fixes) if fixes else "; nothing tried fits: use more ranks or sharding"
            for r in over:
                out.refusal.append(
                    f"role {r.role} (ranks {_ranks(r.ranks)}): predicted peak {r.predicted_peak_bytes / GIB:.2f} GiB"
                    f" > memory budget {budget.bytes / GIB:.2f} GiB ({budget.origin}){hint};"
                    " or --job.allow_over_budget=true to start anyway")
        return out
    finally:
        dist.destroy_process_group()


def _ranks(ranks: list[int]) -> str:
    return f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)) else \
        ",".join(map(str, ranks))


def main() -> None:
    """The child: `python -m torchtitan.memory.startup <trainer argv>` -> StartupMemory as
    JSON, the last stdout line."""
    from torchtitan.config import load_config_or_exit

    world = int(os.environ["WORLD_SIZE"])
    cfg = load_config_or_exit(sys.argv[1:], world, quiet=True)
    out = _predict(cfg, world, os.environ["TITAN_PREDICT_DEVICE"])
    print(json.dumps({"roles": [{**r.record(), "pp_rank": r.pp_rank} for r in out.roles],
                      "budget_bytes": out.budget_bytes, "budget_origin": out.budget_origin, "refusal": out.refusal,
                      "free_bytes": out.free_bytes, "budget_note": out.budget_note}))


def share(startup: StartupMemory | None) -> StartupMemory | None:
    """Rank 0's prediction to every rank (after the real process group exists)."""
    box = [startup]
    dist.broadcast_object_list(box, src=0)
    return box[0]


if __name__ == "__main__":
    main()
