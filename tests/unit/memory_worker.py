"""One process on the fake process group: the memory prediction of a job (fake tensors) and
its deterministic reference (the same step on real tensors, measured by the CPU allocator).

    python tests/unit/memory_worker.py WORLD [overrides...]   -> JSON lines, one per pipeline rank
"""

import json
import os
import sys

import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from torchtitan.config import load_config  # noqa: E402
from torchtitan.distributed.parallel_dims import ParallelDims  # noqa: E402
from torchtitan.dry_run import build_model  # noqa: E402
from torchtitan.memory.fake_paths import PipelineStartup  # noqa: E402
from torchtitan.memory.simulate import simulate_pp_rank  # noqa: E402


def main() -> None:
    world, argv = int(sys.argv[1]), sys.argv[2:]
    cfg, _ = load_config(["--training.device=cpu", "--job.dry_run=true", *argv], world)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    dims = ParallelDims.from_config(cfg, world)
    dims.build_mesh("cpu")
    spec, model, args = build_model(cfg)
    fake_startup, real_startup = PipelineStartup(), PipelineStartup()
    for pp_rank in range(dims.pp):
        fake = simulate_pp_rank(spec, model, dims, cfg, "cpu", pp_rank, args, fake_startup)
        real = simulate_pp_rank(spec, model, dims, cfg, "cpu", pp_rank, args, real_startup, profile=True)
        print(json.dumps({"pp_rank": pp_rank, "predicted": fake.peak_bytes, "tracked_real": real.peak_bytes,
                          "allocator": real.allocator_peak_bytes, "breakdown": fake.breakdown}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
