"""One process on the fake process group: a job's per-role prediction with the shortcuts of
torchtitan/planning/simulate/roles.py (forced on: EXACT_LIMIT 0) and with every role simulated whole.

    python tests/integration/shortcut_worker.py WORLD N_LAYERS [overrides...]   -> one JSON line
"""

import dataclasses
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from torchtitan import hardware  # noqa: E402
from torchtitan.checks import load_config  # noqa: E402
from torchtitan.models.flavors import model_args  # noqa: E402
from torchtitan.planning.memory import predict  # noqa: E402
from torchtitan.planning.simulate import roles as derived_roles  # noqa: E402
from torchtitan.training.build import fake_world, model_on_meta  # noqa: E402
from torchtitan.training.planned_job import PlannedJob  # noqa: E402


def main() -> None:
    world, flavor, n_layers, argv = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4:]
    cfg, _ = load_config(["--training.device=cpu", "--job.dry_run=true", *argv], world)
    cfg = dataclasses.replace(
        cfg, parallelism=dataclasses.replace(cfg.parallelism, pipeline_parallel_split_points=[])
    )
    with fake_world(cfg, world) as dims:
        meta = model_on_meta(cfg)
        args = dataclasses.replace(
            model_args(cfg.model.name, flavor, meta.args.vocab_size, cfg.training.seq_len, cfg.moe),
            n_layers=n_layers,
        )
        job = PlannedJob(cfg, model_on_meta(cfg, args), dims, "cpu")
        derived_roles.EXACT_LIMIT = 0
        hw = hardware.PROFILES["h100_sxm"]  # the step time is extrapolated alike (issue 47)
        fast, _ = predict.predict_roles(job, hardware=hw)
        derived_roles.EXACT_LIMIT = 10**9
        derived_roles.rank_plan = lambda job, freeing: derived_roles.RankPlan(
            list(range(job.dims.pp)), [], {}
        )
        full, _ = predict.predict_roles(job, hardware=hw)

        def record(r):
            return {**r.record(), "time": r.time.record()}

        print(
            json.dumps({"fast": [record(r) for r in fast], "full": [record(r) for r in full]}),
            flush=True,
        )


if __name__ == "__main__":
    main()
