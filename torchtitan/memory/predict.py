"""The per-rank-role peak memory of a training step, predicted before launch.

A role is a pipeline rank: ranks of one pipeline rank hold the same shapes at every
data / tensor / expert-parallel coordinate (FSDP2 and SimpleFSDP pad uneven shards to equal
size; TP and EP degrees must divide what they split, which the config check enforces), so
the role's prediction is that of its first coordinate, and `ranks` lists them all.

Each role's step is simulated on fake tensors (simulate.py) in this process, which must
have joined a process group of the job's world size (the dry run's fake one). For a MoE
job with expert parallelism the planned figure assumes the routing skew of
`moe.memory_skew` (1 = balanced) and the worst case (every token copy of the EP group
routed to one rank's experts) is simulated beside it.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch

from torchtitan.distributed.parallel_dims import MeshDim, ParallelDims
from torchtitan.memory.fake_paths import PipelineStartup
from torchtitan.memory.simulate import CATEGORIES, simulate_pp_rank

GIB = 2**30


@dataclass
class RolePrediction:
    role: str
    ranks: list[int]
    pp_rank: int
    stage_ids: list[int]
    predicted_peak_bytes: int
    worst_case_peak_bytes: int
    peak_at: str
    breakdown: dict[str, int]

    def record(self) -> dict:
        """The plan.json `memory_per_rank_role` entry (a stable format: tools read it)."""
        return {"role": self.role, "ranks": self.ranks, "stages": self.stage_ids,
                "predicted_peak_bytes": self.predicted_peak_bytes,
                "worst_case_peak_bytes": self.worst_case_peak_bytes, "peak_at": self.peak_at,
                "breakdown": self.breakdown}


def ranks_of_pp_rank(dims: ParallelDims, pp_rank: int) -> list[int]:
    """Global ranks whose pipeline coordinate is `pp_rank` (every rank when no PP)."""
    if dims.pp == 1:
        return list(range(dims.world_size))
    names = list(dims.mesh_shape)
    shape = [dims.mesh_shape[n] for n in names]
    pp_axis = names.index(MeshDim.PP.value)
    ranks = torch.arange(dims.world_size).view(*shape)
    return sorted(ranks.select(pp_axis, pp_rank).flatten().tolist())


def predict_roles(spec, model, dims: ParallelDims, cfg, target: str, args) -> tuple[list[RolePrediction], list[dict]]:
    """Every role's peak (in pipeline-rank order: stage 0's boundary tensors are learnt
    first), and the plan.json entries of every stage."""
    startup = PipelineStartup()
    worst_startup = PipelineStartup()
    skew = cfg.moe.memory_skew
    moe = dims.ep > 1
    out, records = [], []
    for pp_rank in range(dims.pp):
        planned = simulate_pp_rank(spec, model, dims, cfg, target, pp_rank, args, startup, ep_skew=skew)
        worst = planned
        if moe and skew < dims.ep:
            worst = simulate_pp_rank(spec, model, dims, cfg, target, pp_rank, args, worst_startup, ep_skew=dims.ep)
        records += planned.plan_records
        role = f"pp{pp_rank}" if dims.pp > 1 else "all"
        out.append(RolePrediction(role, ranks_of_pp_rank(dims, pp_rank), pp_rank, planned.stage_ids,
                                  planned.peak_bytes, max(worst.peak_bytes, planned.peak_bytes), planned.peak_at,
                                  planned.breakdown))
    return out, records


def role_table(roles: list[RolePrediction], budget: int | None) -> str:
    """The dry run's per-role table (GiB)."""
    shown = [c for c in CATEGORIES if any(r.breakdown.get(c) for r in roles)]
    short = {"parameters": "params", "optimizer_states": "adamw", "gradients": "grads",
             "unsharded_parameters": "gathered", "activations": "activ", "logits_and_loss": "logits",
             "backward_transients": "bwd tmp", "ep_dispatch": "ep a2a", "pipeline_buffers": "pp bufs",
             "optimizer_transients": "opt tmp", "inputs_and_buffers": "buffers"}
    head = ["role", "ranks", "peak GiB"] + [short[c] for c in shown] + ["worst GiB", "peak at"]
    rows = [head]
    for r in roles:
        ranks = f"{r.ranks[0]}..{r.ranks[-1]} ({len(r.ranks)})" if len(r.ranks) > 3 else ",".join(map(str, r.ranks))
        rows.append([r.role, ranks, f"{r.predicted_peak_bytes / GIB:.3f}"]
                    + [f"{r.breakdown.get(c, 0) / GIB:.3f}" for c in shown]
                    + [f"{r.worst_case_peak_bytes / GIB:.3f}", r.peak_at])
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i in (0, 1, len(head) - 1) else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    if budget is not None:
        over = [r.role for r in roles if r.predicted_peak_bytes > budget]
        lines.append(f"budget {budget / GIB:.3f} GiB per rank: " + (f"OVER for {', '.join(over)}" if over else "every role fits"))
    return "\n".join(lines)
