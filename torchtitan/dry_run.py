"""Dry run: plan a job of any size in one CPU process, without allocating weights.

    NGPU=512 CONFIG_FILE=train_configs/llama3_405b.toml ./run_train.sh --job.dry_run=true

One process joins a fake process group of world size NGPU (collectives do nothing), builds
the model on meta, and for every pipeline rank splits, plans and parallelizes its stages
(TP -> AC -> compile -> FSDP) exactly as training would, as seen from that pipeline rank's
first data/tensor-parallel coordinate. It prints the reshard plan and a per-rank memory
estimate and writes plan.json.
"""

import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from torchtitan.config import load_config_or_exit
from torchtitan.distributed.model_parts import ModelParts, build_parts, plan_records
from torchtitan.distributed.parallel_dims import ParallelDims
from torchtitan.distributed.plan_report import compress_table, plan_table, write_plan_json
from torchtitan.protocols.train_spec import get_train_spec, model_args

GIB = 2**30


def memory_estimate(parts: ModelParts) -> dict:
    """Per-rank bytes: fp32 sharded params, grads and AdamW states; peak unsharded params =
    units kept between forward and backward + the two largest resharded units (one in use,
    one prefetched). Activations are not included."""
    sharded = sum(
        (p.to_local() if isinstance(p, DTensor) else p).numel() * 4 for m in parts.modules for p in m.parameters()
    )
    units = [u for plan in parts.plans for u in plan.units]
    freed = sorted((u.param_bytes for u in units if u.reshard), reverse=True)
    peak_unsharded = sum(u.param_bytes for u in units if not u.reshard) + sum(freed[:2])
    return {
        "params_bytes": sharded,
        "grads_bytes": sharded,
        "optimizer_bytes": 2 * sharded,
        "peak_unsharded_params_bytes": peak_unsharded,
        "total_bytes": 4 * sharded + peak_unsharded,
        "param_dtype": parts.param_dtype,
    }


def main(argv: list[str] | None = None) -> int:
    start = time.perf_counter()
    argv = sys.argv[1:] if argv is None else argv
    world = int(os.environ.get("WORLD_SIZE", os.environ.get("NGPU", "1")))
    cfg = load_config_or_exit(argv, world)
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    dims = ParallelDims.from_config(cfg, world)
    dims.build_mesh("cpu")
    target = "cpu" if cfg.training.device == "cpu" else "cuda"  # the machine the job is planned for

    spec = get_train_spec(cfg.model.name)
    vocab = 0
    if not spec.flavors[cfg.model.flavor].vocab_size:
        from torchtitan.components.tokenizer import Tokenizer

        vocab = Tokenizer(cfg.model.tokenizer_path).vocab_size
    args = model_args(cfg.model.name, cfg.model.flavor, vocab, cfg.training.seq_len, cfg.moe)
    with torch.device("meta"):
        model = spec.model_cls(args)
    n_params = sum(p.numel() for p in model.parameters())

    records, memory = [], []
    for pp_rank in range(dims.pp):
        parts = build_parts(spec, model, dims, cfg, target, pp_rank)
        records += plan_records(parts)
        memory.append({"pp_rank": pp_rank, "stages": parts.stage_ids, **memory_estimate(parts)})
    param_dtype = parts.param_dtype

    print(f"[dry run] {cfg.model.name} {cfg.model.flavor}: {n_params / 1e9:,.2f}B parameters, world {world},"
          f" mesh {dims.mesh_shape}, params {param_dtype}, reshard_after_forward"
          f" {cfg.parallelism.reshard_after_forward}, budget {cfg.parallelism.reshard_budget_gib:g} GiB")
    print(compress_table(plan_table(records)))
    print("\nper-rank memory estimate (GiB; activations not included):")
    print(f"{'pp rank':>7}  {'stages':>8}  {'params':>8}  {'grads':>8}  {'adamw':>8}  {'peak unsharded':>14}  {'total':>8}")
    for m in memory:
        print(f"{m['pp_rank']:>7}  {','.join(map(str, m['stages'])):>8}  {m['params_bytes'] / GIB:>8.2f}"
              f"  {m['grads_bytes'] / GIB:>8.2f}  {m['optimizer_bytes'] / GIB:>8.2f}"
              f"  {m['peak_unsharded_params_bytes'] / GIB:>14.2f}  {m['total_bytes'] / GIB:>8.2f}")
    path = write_plan_json(
        cfg.job.dump_folder, world, dims.mesh_shape, records,
        {"dry_run": True, "model": f"{cfg.model.name} {cfg.model.flavor}", "param_dtype": param_dtype,
         "reshard_after_forward": cfg.parallelism.reshard_after_forward,
         "reshard_budget_gib": cfg.parallelism.reshard_budget_gib, "memory_per_pp_rank": memory},
    )
    print(f"\nwrote {path} ({time.perf_counter() - start:.1f}s)")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
