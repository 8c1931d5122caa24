"""Dry run: plan a job of any size in one CPU process, and predict its memory per rank role.

    NGPU=512 CONFIG_FILE=train_configs/llama3_405b.toml ./run_train.sh --job.dry_run=true
    NGPU=8 ... --job.dry_run=true --planning.fit=local_batch_size   # the largest that fits the budget

One process joins a fake process group of world size NGPU (collectives do nothing), builds
the model on meta, and for every pipeline rank splits, plans and parallelizes its stages
(CP -> TP -> EP -> AC -> compile -> data parallel, models/common/parallelize.py) exactly as
training would (training/build.py), then runs one training step of it on fake tensors
(planning/simulate/) to predict the peak of allocated bytes of each rank role, with its
breakdown (planning/memory/), and the time of that step on the job's hardware profile
([hardware], planning/step_time/). It prints the reshard plan and the per-role tables and
writes plan.json; `--planning.fit` searches the largest fit or the fastest layout
(planning/search/).
"""

import logging
import os
import sys
import time

from torchtitan import log
from torchtitan.checks import load_config_or_exit
from torchtitan.checks.job import accepts
from torchtitan.planning.memory.budget import memory_budget, ranks_on_this_node
from torchtitan.planning.memory.fit import fit_report
from torchtitan.planning.memory.predict import predict, role_table
from torchtitan.planning.search.nearby import nearby_report
from torchtitan.planning.step_time.local_profile import job_hardware
from torchtitan.planning.step_time.model import time_table
from torchtitan.training.build import fake_world
from torchtitan.training.plan_report import compress_table, plan_table, write_plan_json
from torchtitan.training.planned_job import PlannedJob, model_on_meta
from torchtitan.units import GIB

logger = logging.getLogger("torchtitan.dry_run")  # by name: run as __main__ too


def main(argv: list[str] | None = None) -> int:
    start = time.perf_counter()
    log.setup()
    argv = sys.argv[1:] if argv is None else argv
    world = int(os.environ.get("WORLD_SIZE", os.environ.get("NGPU", "1")))
    cfg = load_config_or_exit(argv, world)
    target = "cpu" if cfg.training.device == "cpu" else "cuda"  # the machine the job is planned for
    budget = memory_budget(cfg, ranks_on_this_node(world))
    if target == "cuda" and budget is not None and budget.origin.startswith("CPU"):
        budget = None  # planned for GPUs on a machine without one: the default is unknown here
    hardware = job_hardware(cfg, target, measure=True)
    if cfg.planning.fit == "layout":
        return layout_main(cfg, world, target, budget=budget, hardware=hardware, start=start)
    with fake_world(cfg, world) as dims:
        job = PlannedJob(cfg, model_on_meta(cfg), dims, target)
        n_params = sum(p.numel() for p in job.model.parameters())
        prediction = predict(job, None if budget is None else budget.bytes, hardware)
        roles, records = prediction.roles, prediction.plan_records
        p = cfg.parallelism
        logger.info(
            f"[dry run] {cfg.model.name} {cfg.model.flavor}: {n_params / 1e9:,.2f}B parameters, world {world},"
            f" mesh {dims.mesh_shape}, reshard_after_forward {p.reshard_after_forward},"
            f" memory budget {'none' if budget is None else f'{budget.bytes / GIB:.2f} GiB ({budget.origin})'}"
        )
        logger.info(compress_table(plan_table(records)))
        logger.info(
            "\npredicted peak of allocated bytes per rank role (one training step, eager; GiB):"
        )
        logger.info(role_table(roles, None if budget is None else budget.bytes))
        times = [r.time for r in roles if r.time is not None]
        if times:
            logger.info(
                f"\npredicted step time per rank role (hardware {hardware.name}: {hardware.source}):"
            )
            logger.info(time_table(times))
        c = cfg.checkpoint
        if (
            c.enable
            and c.async_mode in ("async", "async_with_pinned_mem")
            and c.interval < cfg.training.steps
            and target == "cuda"
        ):
            host = max(
                r.breakdown.get("parameters", 0) + r.breakdown.get("optimizer_states", 0)
                for r in roles
            )
            logger.info(
                f"async checkpoints: every rank also keeps a staged copy of its checkpoint state in pinned host"
                f" memory: up to {host / GIB:.3f} GiB per rank (times the ranks of a node)"
            )
        extra = {}
        if times and cfg.planning.nearby:
            text, nearby = nearby_report(job, accepts(world), hardware, roles)
            logger.info("\n" + text)
            extra["nearby_choices"] = nearby
        if cfg.planning.fit:
            text, extra = fit_report(job, budget, cfg.planning.fit, accepts(world))
            logger.info("\n" + text)
        path = write_plan_json(
            cfg.job.dump_folder,
            world,
            dims.mesh_shape,
            records,
            {
                "dry_run": True,
                "model": f"{cfg.model.name} {cfg.model.flavor}",
                "reshard_after_forward": p.reshard_after_forward,
                "memory_budget_bytes": None if budget is None else budget.bytes,
                "memory_per_rank_role": [r.record() for r in roles],
                "step_time_per_rank_role": [t.record() for t in times],
                "hardware": None if hardware is None else hardware.record(),
                **extra,
            },
        )
    logger.info(f"\nwrote {path} ({time.perf_counter() - start:.1f}s)")
    return 0


def layout_main(cfg, world: int, target: str, *, budget, hardware, start: float) -> int:
    """--planning.fit=layout: the layout search (planning/search/search.py) instead of the job's plan."""
    import json

    from torchtitan.distributed.job_shape import degrees
    from torchtitan.planning.memory.budget import CUDA_MARGIN
    from torchtitan.planning.search import search as layout_search
    from torchtitan.planning.search import space as layout_space

    if hardware is None:
        logger.error(
            "error: fit=layout: no hardware profile to predict step times with (--hardware.profile)"
        )
        return 2
    if budget is None:
        budget_bytes = int(hardware.memory_gib * GIB * (1 - CUDA_MARGIN))
        origin = f"{hardware.name}: {hardware.memory_gib:.1f} GiB - {CUDA_MARGIN:.0%}"
    else:
        budget_bytes, origin = budget.bytes, budget.origin
    choose_float8 = cfg.planning.layout_float8 == "choose"
    if choose_float8 and "float8" not in hardware.peak_tflops:
        logger.error(
            f"error: --planning.layout_float8=choose: {hardware.name} has no float8 tensor cores"
            " (SM89 or later); use --planning.layout_float8=keep"
        )
        return 2
    job = PlannedJob(cfg, model_on_meta(cfg), degrees(cfg, world), target)  # no mesh: shapes only
    global_batch = job.batch.global_batch
    configured = layout_space.layout_of(
        cfg, world, global_batch, job.args.n_layers, float8_choice=choose_float8
    )
    logger.info(
        f"[dry run] layout search: {cfg.model.name} {cfg.model.flavor}, {world} devices"
        f" ({hardware.gpus_per_node} per node), hardware {hardware.name}, global batch {global_batch} x"
        f" {cfg.training.seq_len} tokens, compile {'on' if cfg.compile.enable else 'off'},"
        f" float8 {'chosen' if choose_float8 else 'as configured'},"
        f" budget {budget_bytes / GIB:.2f} GiB ({origin})"
    )
    result = layout_search.search(
        job,
        hardware,
        budget_bytes,
        accepts(world),
        cfg.planning.layout_candidates,
        configured=configured,
        max_seconds=cfg.planning.layout_seconds,
    )
    logger.info("\n" + layout_search.report(result, global_batch))
    os.makedirs(cfg.job.dump_folder, exist_ok=True)
    if result.pick is not None:
        path = layout_search.write_snippet(cfg.job.dump_folder, result.pick.layout, global_batch)
        logger.info(f"\nwrote {path}")
    out = os.path.join(cfg.job.dump_folder, "layout_search.json")
    with open(out, "w") as f:
        json.dump(
            {
                "model": f"{cfg.model.name} {cfg.model.flavor}",
                "world": world,
                "hardware": hardware.name,
                "global_batch": global_batch,
                "budget_bytes": budget_bytes,
                "seconds": result.seconds,
                "enumerated": result.enumerated,
                "within_states": result.after_states,
                "scored": result.scored,
                "feasible": result.feasible,
                "headroom": layout_search.HEADROOM,
                "band": result.band,
                "pick": None if result.pick is None else result.pick.record(global_batch),
                "simulated": [c.record(global_batch) for c in result.simulated],
                "ties": [c.record(global_batch) for c in result.ties],
                "top": [c.record(global_batch) for c in result.ranking[:50]],
                # 32 layouts spread evenly over the whole ranking (the pick check measures them)
                "spread": [
                    c.record(global_batch)
                    for c in result.ranking[:: max(1, len(result.ranking) // 32)][:32]
                ],
            },
            f,
            indent=1,
        )
    logger.info(f"wrote {out} ({time.perf_counter() - start:.1f}s)")
    return 0 if result.pick is not None else 1


if __name__ == "__main__":
    sys.exit(main())
