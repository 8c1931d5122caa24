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

import copy
import os
import dataclasses
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


@dataclass
class Prediction:
    roles: list[RolePrediction]
    plan_records: list[dict]  # plan.json `model_parts` entries of every stage
    free_bytes: dict[int, int]  # per pipeline rank: kept bytes auto frees for the budget
    budget_note: str = ""


def predict(spec, model, dims: ParallelDims, cfg, target: str, args, budget: int | None = None) -> Prediction:
    """Every role's peak. With reshard_after_forward=auto and a budget some role exceeds,
    the plan frees kept units (reshard_policy) by what the prediction says is over, and
    predicts again, until every role fits or nothing kept is left to free."""
    free: dict[int, int] = {}
    note = ""
    roles, records = predict_roles(spec, model, dims, cfg, target, args)
    if budget is None or cfg.parallelism.reshard_after_forward != "auto":
        return Prediction(roles, records, free)
    for _ in range(4):
        over = {r.pp_rank: r.predicted_peak_bytes - budget for r in roles if r.predicted_peak_bytes > budget}
        kept = {pp: sum(u["param_bytes"] for rec in records if rec["stage"] in _stages(roles, pp)
                        for u in rec["fsdp_units"] if not u["reshard_after_forward"] and u["name"] != "<root>")
                for pp in over}
        over = {pp: b for pp, b in over.items() if kept[pp] > 0}
        if not over:
            break
        worst = max(r.predicted_peak_bytes for r in roles)
        note = f"predicted peak {worst / GIB:.2f} GiB > budget {budget / GIB:.2f} GiB"
        for pp, b in over.items():
            free[pp] = free.get(pp, 0) + b
        roles, records = predict_roles(spec, model, dims, cfg, target, args, free, note)
    return Prediction(roles, records, free, note)


def _stages(roles: list[RolePrediction], pp_rank: int) -> list[int]:
    return next(r.stage_ids for r in roles if r.pp_rank == pp_rank)


# Above this many block-microbatches per rank a step is simulated with 1 and 2 blocks per
# stage and extrapolated linearly to the real count (see `_reduced`); below it, exactly.
EXACT_LIMIT = int(os.environ.get("TITAN_MEMORY_EXACT_LIMIT", "48"))  # (checked against exact: README)


def _blocks_per_stage(cfg, dims: ParallelDims, args) -> tuple[list[list[int]], object]:
    """Per pipeline rank, the block counts of its stages; and the layout (None without PP)."""
    from torchtitan.distributed.model_parts import pipeline_layout

    layout = pipeline_layout(cfg, dims, args.n_layers)
    if layout is None:
        return [[args.n_layers]], None
    return [[len(layout.stages[s]) for s in layout.stage_ids(r)] for r in range(dims.pp)], layout


def _reduced(cfg, args, layout, k: int):
    """The job with k blocks per stage (same stages, schedule, batch), or None when a stage
    mixes block kinds (DeepSeek-V3's dense prefix must fill whole stages)."""
    dense = getattr(args, "n_dense_layers", 0)
    stages = layout.stages if layout is not None else (tuple(range(args.n_layers)),)
    kinds = [{i < dense for i in st} for st in stages]
    if any(len(kind) > 1 for kind in kinds):
        return None
    new_dense = k * sum(1 for kind in kinds if kind == {True})
    n = k * len(stages)
    small = dataclasses.replace(args, n_layers=n, **({"n_dense_layers": new_dense} if dense else {}))
    if layout is None:
        return cfg, small
    p = dataclasses.replace(cfg.parallelism, pipeline_parallel_layers_per_stage=k, pipeline_parallel_split_points=[])
    return dataclasses.replace(cfg, parallelism=p), small


def predict_roles(spec, model, dims: ParallelDims, cfg, target: str, args, free: dict[int, int] | None = None,
                  note: str = "") -> tuple[list[RolePrediction], list[dict]]:
    """Every role's peak, and the plan.json entries of every stage. Large jobs are simulated
    at 1 and 2 blocks per stage and extrapolated (every quantity a step holds grows linearly
    with the blocks of a stage: parameters, states, saved activations, gathered units)."""
    from torchtitan.distributed.model_parts import resolve_parts
    from torchtitan.dtypes import param_dtype

    counts, layout = _blocks_per_stage(cfg, dims, args)
    microbatches = (layout is not None and cfg.training.local_batch_size // cfg.parallelism.pipeline_parallel_microbatch_size) or 1
    work = max(sum(c) for c in counts) * microbatches
    small = [_reduced(cfg, args, layout, k) for k in (1, 2)] if work > EXACT_LIMIT and not free else [None]
    if any(x is None for x in small):
        return _predict_exact(spec, model, dims, cfg, target, args, free or {}, note)
    (cfg1, args1), (cfg2, args2) = small
    with torch.device("meta"):
        model1, model2 = spec.model_cls(args1), spec.model_cls(args2)
    roles1, _ = _predict_exact(spec, model1, dims, cfg1, target, args1, {}, note)
    roles2, _ = _predict_exact(spec, model2, dims, cfg2, target, args2, {}, note)
    roles = []
    for r1, r2, c in zip(roles1, roles2, counts):
        x = sum(c) / len(c) - 1  # blocks per stage beyond the 1-block simulation

        def line(a: int, b: int) -> int:
            return max(0, round(a + x * (b - a)))

        roles.append(RolePrediction(r2.role, r2.ranks, r2.pp_rank, r2.stage_ids,
                                    line(r1.predicted_peak_bytes, r2.predicted_peak_bytes),
                                    line(r1.worst_case_peak_bytes, r2.worst_case_peak_bytes),
                                    f"{r2.peak_at} (extrapolated from 1 and 2 blocks per stage)",
                                    {k: line(r1.breakdown.get(k, 0), r2.breakdown.get(k, 0)) for k in r2.breakdown}))
    dtype = param_dtype(cfg.training.mixed_precision_param, target)
    records = [plan.record() for r in range(dims.pp)
               for plan in resolve_parts(spec, copy.deepcopy(model) if dims.pp == 1 else model, dims, cfg, dtype, r).plans]
    return roles, records


def _predict_exact(spec, model, dims: ParallelDims, cfg, target: str, args, free: dict[int, int],
                   note: str) -> tuple[list[RolePrediction], list[dict]]:
    """Every role simulated whole (in pipeline-rank order: stage 0's boundary tensors are
    learnt first)."""
    startup = PipelineStartup()
    worst_startup = PipelineStartup()
    skew = cfg.moe.memory_skew
    moe = dims.ep > 1
    out, records = [], []
    for pp_rank in range(dims.pp):
        planned = simulate_pp_rank(spec, model, dims, cfg, target, pp_rank, args, startup, ep_skew=skew,
                                   free_bytes=free.get(pp_rank, 0), budget_note=note)
        worst = planned
        if moe and skew < dims.ep:
            worst = simulate_pp_rank(spec, model, dims, cfg, target, pp_rank, args, worst_startup, ep_skew=dims.ep,
                                     free_bytes=free.get(pp_rank, 0), budget_note=note)
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
