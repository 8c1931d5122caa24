"""One process on the fake process group: the memory prediction of a job (fake tensors) and
its deterministic reference (the same step on real tensors, measured by the CPU allocator).

    python tests/integration/memory_worker.py WORLD [overrides...]   -> JSON lines, one per pipeline rank
"""

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from torchtitan.checks import load_config  # noqa: E402
from torchtitan.planning.simulate.patches import PipelineStartup  # noqa: E402
from torchtitan.planning.simulate.step import simulate_pp_rank  # noqa: E402
from torchtitan.training.build import fake_world, model_on_meta  # noqa: E402
from torchtitan.training.planned_job import PlannedJob  # noqa: E402


def main() -> None:
    world, argv = int(sys.argv[1]), sys.argv[2:]
    cfg, _ = load_config(["--training.device=cpu", "--job.dry_run=true", *argv], world)
    with fake_world(cfg, world) as dims:
        job = PlannedJob(cfg, model_on_meta(cfg), dims, "cpu")
        fake_startup, real_startup = PipelineStartup(), PipelineStartup()
        for pp_rank in range(dims.pp):
            fake = simulate_pp_rank(job, pp_rank, fake_startup)
            real = simulate_pp_rank(job, pp_rank, real_startup, profile=True)
            print(
                json.dumps(
                    {
                        "pp_rank": pp_rank,
                        "predicted": fake.peak_bytes,
                        "tracked_real": real.peak_bytes,
                        "allocator": real.allocator_peak_bytes,
                        "breakdown": fake.breakdown,
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
