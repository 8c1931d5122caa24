"""The start-up plan: a table for the log and plan.json in the dump folder."""

import json
import os

from torchtitan.units import MIB


def plan_table(model_parts: list[dict]) -> str:
    """model_parts: plan.json entries, every stage of the job (sorted by stage)."""
    rows = [("PP stage", "FSDP unit", "unsharded MiB", "reshard", "AC region", "reason")]
    for part in sorted(model_parts, key=lambda p: p["stage"]):
        regions = {r["name"]: r["label"] for r in part.get("ac_regions", [])}
        for u in part["fsdp_units"]:
            name = u["name"] + (
                f" [{u['mesh']} mesh]" if "mesh" in u else ""
            )  # experts: their own mesh
            rows.append(
                (
                    str(part["stage"]),
                    name,
                    f"{u['param_bytes'] / MIB:,.1f}",
                    "yes" if u["reshard_after_forward"] else "no",
                    regions.get(u["name"], "-"),
                    u["reason"],
                )
            )
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = []
    for i, r in enumerate(rows):
        lines.append(
            "  ".join(
                c.rjust(w) if j == 2 else c.ljust(w) for j, (c, w) in enumerate(zip(r[:5], widths))
            )
            + "  "
            + r[5]
        )
        if i == 0:
            lines.append("-" * (sum(widths) + 10 + len(r[5])))
    return "\n".join(lines)


def compress_table(table: str, head: int = 12, tail: int = 4) -> str:
    """Long tables (hundreds of blocks) keep their first and last rows."""
    lines = table.splitlines()
    if len(lines) <= head + tail + 1:
        return table
    return "\n".join(
        lines[:head]
        + [f"... {len(lines) - head - tail} more rows in plan.json ..."]
        + lines[-tail:]
    )


def write_plan_json(
    dump_folder: str, world_size: int, mesh: dict, model_parts: list[dict], extra: dict
) -> str:
    os.makedirs(dump_folder, exist_ok=True)
    path = os.path.join(dump_folder, "plan.json")
    data = {
        "world_size": world_size,
        "mesh": mesh,
        **extra,
        "model_parts": sorted(model_parts, key=lambda p: p["stage"]),
    }
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
    return path


def report_plan(
    records: list[dict],
    dims,
    cfg,
    *,
    budget_bytes: int | None,
    roles: list[dict] | None,
    log,
    times: list[dict] | None = None,
) -> None:
    """Every pipeline rank's plan records -> rank 0 writes plan.json (with the memory budget
    and the start-up prediction's role records and step times, or None) and logs the table.
    Collective over the pipeline ranks."""
    import torch.distributed as dist

    if dims.pp > 1:
        gathered = [None] * dims.pp
        dist.all_gather_object(gathered, records, group=dims.pp_group())
        records = [r for rank_records in gathered for r in rank_records]
    if dist.get_rank() != 0:
        return
    p = cfg.parallelism
    path = write_plan_json(
        cfg.job.dump_folder,
        dims.world_size,
        dims.mesh_shape,
        records,
        {
            "reshard_after_forward": p.reshard_after_forward,
            "memory_budget_bytes": budget_bytes,
            "memory_per_rank_role": roles,
            "step_time_per_rank_role": times,
        },
    )
    log(
        f"[torchtitan] FSDP plan (reshard_after_forward={p.reshard_after_forward}), written to {path}:\n"
        + compress_table(plan_table(records))
    )
