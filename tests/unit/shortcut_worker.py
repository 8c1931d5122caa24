"""One process on the fake process group: a job's per-role prediction with the shortcuts of
torchtitan/memory/shortcuts.py (forced on: EXACT_LIMIT 0) and with every role simulated whole.

    python tests/unit/shortcut_worker.py WORLD N_LAYERS [overrides...]   -> one JSON line
"""

import dataclasses
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from torchtitan.config import load_config  # noqa: E402
from torchtitan.distributed.parallel_dims import ParallelDims  # noqa: E402
from torchtitan.dry_run import build_model  # noqa: E402
from torchtitan.memory import predict, shortcuts  # noqa: E402
from torchtitan.models.flavors import model_args  # noqa: E402


def main() -> None:
    world, flavor, n_layers, argv = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4:]
    cfg, _ = load_config(["--training.device=cpu", "--job.dry_run=true", *argv], world)
    cfg = dataclasses.replace(cfg, parallelism=dataclasses.replace(cfg.parallelism, pipeline_parallel_split_points=[]))
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    dims = ParallelDims.from_config(cfg, world)
    dims.build_mesh("cpu")
    spec, _, args = build_model(cfg)
    args = dataclasses.replace(model_args(cfg.model.name, flavor, args.vocab_size, cfg.training.seq_len, cfg.moe),
                               n_layers=n_layers)
    with torch.device("meta"):
        model = spec.model_cls(args)
    shortcuts.EXACT_LIMIT = 0
    fast, _ = predict.predict_roles(spec, model, dims, cfg, "cpu", args)
    shortcuts.EXACT_LIMIT = 10**9
    shortcuts.rank_plan = lambda cfg, dims, args, freeing: shortcuts.RankPlan(list(range(dims.pp)), [], {})
    full, _ = predict.predict_roles(spec, model, dims, cfg, "cpu", args)
    print(json.dumps({"fast": [r.record() for r in fast], "full": [r.record() for r in full]}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
