"""Child process of test_memory_fake_world.py: parallelize small models on a fake process
group of each case's world size, from rank 0's view as the dry run does (so rank 0 holds the
largest piece of every unevenly split parameter), and print per case and pipeline rank the
parameter elements it holds (local shards of TP / EP / FSDP DTensors). A child, so that
pytest's process keeps no default process group.

    python tests/integration/model_states_worker.py '[[world, [override, ...]], ...]'
"""

import json
import sys

from torch.distributed.tensor import DTensor

from torchtitan.checks import load_config
from torchtitan.models.flavors import model_args
from torchtitan.training.build import build_parts, fake_world, model_on_meta
from torchtitan.training.planned_job import PlannedJob

VOCAB = 2048  # the bundled tokenizer's, which the tiny flavors take


def held_per_pp_rank(world: int, argv: list[str]) -> list[int]:
    cfg, _ = load_config(argv + ["--job.dry_run=true"], world)
    with fake_world(cfg, world) as dims:
        args = model_args(cfg.model.name, cfg.model.flavor, VOCAB, cfg.training.seq_len, cfg.moe)
        held = []
        for pp_rank in range(dims.pp):
            meta = model_on_meta(cfg, args)  # fresh: without PP the model itself is parallelized
            parts = build_parts(PlannedJob(cfg, meta, dims, "cpu"), pp_rank)
            held.append(
                sum(
                    (p.to_local() if isinstance(p, DTensor) else p).numel()
                    for m in parts.modules
                    for p in m.parameters()
                )
            )
        return held


if __name__ == "__main__":
    print(json.dumps([held_per_pp_rank(world, argv) for world, argv in json.loads(sys.argv[1])]))
