#!/usr/bin/env python3
"""Bytes each rank reads when a job starts from a Hugging Face folder, computed from the
flavor's shapes and the job's layout (no folder needed), per pipeline rank:

    NGPU=2048 python scripts/hf_read_bytes.py --job.config_file=train_configs/deepseek_v3_671b.toml --fp8

Every rank of a pipeline rank reads the same amount (its shards of the stage's tensors, its
experts only). --fp8: the published DeepSeek-V3 format (float8 projection weights with a
float32 scale per 128 x 128 tile; the rest bfloat16); otherwise every tensor is bfloat16.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> int:
    fp8 = "--fp8" in sys.argv
    argv = [a for a in sys.argv[1:] if a != "--fp8"] + [
        "--job.dry_run=true"
    ]  # the dry run's checks: no tokenizer file needed
    from torchtitan.checks import load_config_or_exit
    from torchtitan.models.hf.read_plan import folder_bytes, planned_bytes
    from torchtitan.training.build import build_parts, fake_world
    from torchtitan.training.planned_job import PlannedJob, model_on_meta

    world = int(os.environ.get("NGPU", "1"))
    cfg = load_config_or_exit(argv, world)
    with fake_world(cfg, world) as dims:
        job = PlannedJob(cfg, model_on_meta(cfg), dims, "cuda")
        total = folder_bytes(cfg.model.name, job.args, 2, fp8)
        fmt = "fp8 (128 x 128 block scales)" if fp8 else "bfloat16"
        print(
            f"{cfg.model.name} {cfg.model.flavor}, world {world}, mesh {dims.mesh_shape}, folder {fmt}:"
            f" {total / 2**30:,.1f} GiB of weights"
        )
        print(f"{'pp rank':>8} {'GiB read per rank':>18} {'% of folder':>12}")
        for pp_rank in range(dims.pp):
            parts = build_parts(job, pp_rank)
            n = planned_bytes(parts.modules, cfg.model.name, job.args, 2, fp8)
            print(f"{pp_rank:>8} {n / 2**30:>18.3f} {n / total * 100:>11.3f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
