"""Child process of test_model_states.py: parallelize small models on a fake process group of each
case's world size, from rank 0's view as the dry run does (so rank 0 holds the largest piece of
every unevenly split parameter), and print per case and pipeline rank the parameter elements
it holds (local shards of TP / EP / FSDP DTensors). A child, so that pytest's process keeps no
default process group.

    python tests/unit/model_states_worker.py '[[world, [override, ...]], ...]'
"""

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.testing._internal.distributed.fake_pg import FakeStore

from torchtitan.config import load_config
from torchtitan.distributed.model_parts import build_parts
from torchtitan.distributed.parallel_dims import ParallelDims
from torchtitan.protocols.train_spec import get_train_spec, model_args

VOCAB = 2048  # the bundled tokenizer's, which the tiny flavors take


def held_per_pp_rank(world: int, argv: list[str]) -> list[int]:
    cfg, _ = load_config(argv + ["--job.dry_run=true"], world)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        dims = ParallelDims.from_config(cfg, world)
        dims.build_mesh("cpu")
        spec = get_train_spec(cfg.model.name)
        args = model_args(cfg.model.name, cfg.model.flavor, VOCAB, cfg.training.seq_len, cfg.moe)
        held = []
        for pp_rank in range(dims.pp):
            with torch.device("meta"):
                model = spec.model_cls(args)  # fresh: without PP the model itself is parallelized
            parts = build_parts(spec, model, dims, cfg, "cpu", pp_rank)
            held.append(sum((p.to_local() if isinstance(p, DTensor) else p).numel()
                            for m in parts.modules for p in m.parameters()))
        return held
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    print(json.dumps([held_per_pp_rank(world, argv) for world, argv in json.loads(sys.argv[1])]))
