"""The prediction's shortcuts for large jobs (torchtitan/memory/derived_roles.py) against simulating
every role whole: interpolated middle ranks byte-equal, extrapolated blocks byte-equal but on
the first pipeline rank (within 2%), and which ranks are simulated."""

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from torchtitan.checks import load_config
from torchtitan.distributed.parallel_dims import ParallelDims
from torchtitan.memory import derived_roles as shortcuts
from torchtitan.memory.predict import RolePrediction

HERE = os.path.dirname(os.path.abspath(__file__))
PP5 = ["--training.seq_len=32", "--training.mixed_precision_param=float32", "--parallelism.pipeline_parallel_degree=5",
       "--parallelism.pipeline_parallel_split_points=layers.2,layers.3,layers.4,layers.5"]  # (the check's 6 layers)
PP6 = ["--training.seq_len=64", "--training.mixed_precision_param=float32", "--parallelism.pipeline_parallel_degree=6"]
DSV3 = "--job.config_file=train_configs/deepseek_v3_debug.toml"

CASES = {  # world, flavor simulated, blocks, overrides
    # Llama3 1F1B: 3 blocks per stage from 1 and 2; pipeline rank 2 interpolated
    "llama_1f1b": (5, "tiny", 15, [*PP5, "--training.local_batch_size=5"]),
    # DeepSeek-V3 with EP 2: the worst case too; a dense first stage; peaks at the last warm-up forward
    "dsv3_ep2_1f1b": (12, "tiny", 6, [DSV3, *PP6, "--training.local_batch_size=6", "--parallelism.expert_parallel_degree=2"]),
    "llama_gpipe": (6, "tiny", 12, [*PP6, "--training.local_batch_size=8", "--parallelism.pipeline_parallel_schedule=GPipe"]),
}


@pytest.mark.parametrize("name", [n if n == "llama_1f1b" else pytest.param(n, marks=pytest.mark.slow) for n in CASES])
def test_shortcuts_equal_full_simulation(name):
    world, flavor, blocks, argv = CASES[name]
    proc = subprocess.run([sys.executable, os.path.join(HERE, "shortcut_worker.py"), str(world), flavor, str(blocks),
                           *argv], capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(HERE)), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    interpolated = [r["role"] for r in out["fast"] if "interpolated" in r["peak_at"]]
    assert interpolated == (["pp2"] if world == 5 else ["pp2", "pp3"])  # the shortcuts were taken
    assert all("extrapolated" in r["peak_at"] for r in out["fast"])
    for fast, full in zip(out["fast"], out["full"]):
        assert (fast["ranks"], fast["stages"]) == (full["ranks"], full["stages"])
        for key in ("predicted_peak_bytes", "worst_case_peak_bytes"):
            error = (fast[key] - full[key]) / full[key]
            # Blocks-only ranks: exact. The first rank's peak moves, as blocks are added, from
            # the start of its backward to the embeddings' backward (unsharded block gradients
            # pile up faster than one microbatch's activations): 1- and 2-block runs do not see
            # that, and the extrapolation falls short (README; measured -1.1% here).
            bound = 0.02 if fast["role"] == "pp0" else 0.0
            assert abs(error) <= bound, (name, fast["role"], key, fast[key], full[key])


def _plan(argv, world):
    cfg, _ = load_config(["--training.device=cpu", "--job.dry_run=true", *argv], world)
    dims = ParallelDims.from_config(cfg, world)
    return shortcuts.rank_plan(cfg, dims, SimpleNamespace(n_layers=cfg_layers(cfg)), False)


def cfg_layers(cfg) -> int:
    from torchtitan.models.flavors import flavors_of

    return flavors_of(cfg.model.name)[cfg.model.flavor].n_layers


@pytest.mark.parametrize("argv,world,simulated,in_flight", [
    # 1F1B on 8 pipeline ranks: 0, 1, 6, 7 simulated; 2..5 derived, holding 6..3 microbatches
    (["--model.flavor=8B", "--parallelism.pipeline_parallel_degree=8", "--training.local_batch_size=8"], 8,
     [0, 1, 6, 7], {1: 7, 2: 6, 3: 5, 4: 4, 5: 3, 6: 2}),
    (["--model.flavor=8B", "--parallelism.pipeline_parallel_degree=8", "--training.local_batch_size=16",
      "--parallelism.pipeline_parallel_schedule=GPipe"], 8, [0, 1, 6, 7], {r: 16 for r in range(1, 7)}),
    # multi-stage schedules, 4 pipeline ranks, unlike middle stages: every rank simulated
    (["--model.flavor=8B", "--parallelism.pipeline_parallel_degree=8", "--training.local_batch_size=16",
      "--parallelism.pipeline_parallel_schedule=Interleaved1F1B"], 8, list(range(8)), {}),
    (["--model.flavor=8B", "--parallelism.pipeline_parallel_degree=4", "--training.local_batch_size=8"], 4,
     [0, 1, 2, 3], {}),
    (["--model.flavor=8B", "--parallelism.pipeline_parallel_degree=8", "--training.local_batch_size=8",
      "--parallelism.pipeline_parallel_split_points=layers.4,layers.8,layers.12,layers.16,layers.20,layers.24,layers.27"],
     8, list(range(8)), {}),
])
def test_which_ranks_are_simulated(argv, world, simulated, in_flight):
    plan = _plan(argv, world)
    assert plan.simulated == simulated and plan.in_flight == in_flight
    assert sorted(plan.simulated + plan.derived) == list(range(world))


def _role(pp_rank, peak, at, activ):
    return RolePrediction(f"pp{pp_rank}", [pp_rank], pp_rank, [pp_rank], peak, peak, at, {"activations": activ})


def test_interpolation_is_linear_in_microbatches_in_flight():
    plan = shortcuts.RankPlan([0, 1, 4, 5], [2, 3], {1: 5, 2: 4, 3: 3, 4: 2})
    roles = {1: _role(1, 500, "backward microbatch 1, stage 1", 50), 4: _role(4, 200, "backward microbatch 1, stage 4", 20)}
    assert shortcuts.interpolable(roles, plan)
    r2 = shortcuts.interpolated(roles, plan, 2, [2])
    assert (r2.predicted_peak_bytes, r2.breakdown, r2.ranks) == (400, {"activations": 40}, [2])
    assert r2.peak_at == "backward microbatch 1, stage 2 (interpolated: 4 microbatches in flight)"
    # the last warm-up forward: a different microbatch, the same point of the schedule
    roles = {1: _role(1, 500, "forward microbatch 4, stage 1", 50), 4: _role(4, 200, "forward microbatch 1, stage 4", 20)}
    assert shortcuts.interpolable(roles, plan)
    assert shortcuts.interpolated(roles, plan, 3, [3]).peak_at.startswith("forward microbatch 2, stage 3")
    # peaks at different points: the middle ranks are simulated instead
    roles = {1: _role(1, 500, "backward microbatch 1, stage 1", 50), 4: _role(4, 200, "backward microbatch 7, stage 4", 20)}
    assert not shortcuts.interpolable(roles, plan)


@pytest.mark.parametrize("env,message", [
    ({"TITAN_MEMORY_WORKERS": "abc"}, "TITAN_MEMORY_WORKERS=abc: must be an integer >= 1 (processes the memory"
     " prediction runs its simulations in; 1 = this one); unset it for the default"),
    ({"TITAN_MEMORY_WORKERS": "0"}, "TITAN_MEMORY_WORKERS=0: must be an integer >= 1"),
    ({"TITAN_MEMORY_EXACT_LIMIT": "-3"}, "TITAN_MEMORY_EXACT_LIMIT=-3: must be an integer >= 0"),
])
def test_bad_memory_environment_is_one_line(env, message):
    from torchtitan.config import ConfigError
    from torchtitan.checks.job import check_memory_env

    with pytest.raises(ConfigError) as e:
        check_memory_env(env)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)
    check_memory_env({"TITAN_MEMORY_WORKERS": "2", "TITAN_MEMORY_EXACT_LIMIT": "0"})  # valid: no error
