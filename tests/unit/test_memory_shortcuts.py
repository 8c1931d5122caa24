"""The prediction's shortcuts for large jobs (torchtitan/planning/simulate/roles.py): which ranks
are simulated, the interpolation, the environment's one-line errors. (The shortcuts against
simulating every role whole, in child processes on the fake process group:
tests/integration/test_memory_fake_world.py.)"""

from types import SimpleNamespace

import pytest

from torchtitan.checks import load_config
from torchtitan.distributed.parallel_dims import ParallelDims
from torchtitan.planning.memory.predict import RolePrediction
from torchtitan.planning.simulate import roles as shortcuts
from torchtitan.training.planned_job import MetaModel, PlannedJob


def _plan(argv, world):
    cfg, _ = load_config(["--training.device=cpu", "--job.dry_run=true", *argv], world)
    dims = ParallelDims.from_config(cfg, world)
    args = SimpleNamespace(n_layers=cfg_layers(cfg), n_dense_layers=0)
    return shortcuts.rank_plan(PlannedJob(cfg, MetaModel(None, None, args), dims, "cpu"), False)


def cfg_layers(cfg) -> int:
    from torchtitan.models.flavors import flavors_of

    return flavors_of(cfg.model.name)[cfg.model.flavor].n_layers


@pytest.mark.parametrize(
    "argv,world,simulated,in_flight",
    [
        # 1F1B on 8 pipeline ranks, 32 blocks: 4 5 4 4 4 4 4 3 (the weighted split); 0, 1 (a
        # block more), 2, 6, 7 simulated; 3..5 derived between 2 and 6, holding 5..3 microbatches
        (
            [
                "--model.flavor=8B",
                "--parallelism.pipeline_parallel_degree=8",
                "--training.local_batch_size=8",
            ],
            8,
            [0, 1, 2, 6, 7],
            {2: 6, 3: 5, 4: 4, 5: 3, 6: 2},
        ),
        (
            [
                "--model.flavor=8B",
                "--parallelism.pipeline_parallel_degree=8",
                "--training.local_batch_size=16",
                "--parallelism.pipeline_parallel_schedule=GPipe",
            ],
            8,
            [0, 1, 2, 6, 7],
            {r: 16 for r in range(2, 7)},
        ),
        # multi-stage schedules, 4 pipeline ranks, unlike middle stages: every rank simulated
        (
            [
                "--model.flavor=8B",
                "--parallelism.pipeline_parallel_degree=8",
                "--training.local_batch_size=16",
                "--parallelism.pipeline_parallel_schedule=Interleaved1F1B",
            ],
            8,
            list(range(8)),
            {},
        ),
        (
            [
                "--model.flavor=8B",
                "--parallelism.pipeline_parallel_degree=4",
                "--training.local_batch_size=8",
            ],
            4,
            [0, 1, 2, 3],
            {},
        ),
        (
            [
                "--model.flavor=8B",
                "--parallelism.pipeline_parallel_degree=8",
                "--training.local_batch_size=8",
                "--parallelism.pipeline_parallel_split_points=layers.4,layers.8,layers.12,layers.16,layers.20,layers.24,layers.27",
            ],
            8,
            list(range(8)),
            {},
        ),
    ],
)
def test_which_ranks_are_simulated(argv, world, simulated, in_flight):
    plan = _plan(argv, world)
    assert plan.simulated == simulated and plan.in_flight == in_flight
    assert sorted(plan.simulated + plan.derived) == list(range(world))


def _role(pp_rank, peak, at, activ):
    return RolePrediction(
        f"pp{pp_rank}", [pp_rank], pp_rank, [pp_rank], peak, peak, at, {"activations": activ}
    )


def test_interpolation_is_linear_in_microbatches_in_flight():
    plan = shortcuts.RankPlan([0, 1, 4, 5], [2, 3], {1: 5, 2: 4, 3: 3, 4: 2})
    roles = {
        1: _role(1, 500, "backward microbatch 1, stage 1", 50),
        4: _role(4, 200, "backward microbatch 1, stage 4", 20),
    }
    assert shortcuts.interpolable(roles, plan)
    r2 = shortcuts.interpolated(roles, plan, 2, [2])
    assert (r2.predicted_peak_bytes, r2.breakdown, r2.ranks) == (400, {"activations": 40}, [2])
    assert r2.peak_at == "backward microbatch 1, stage 2 (interpolated: 4 microbatches in flight)"
    # the last warm-up forward: a different microbatch, the same point of the schedule
    roles = {
        1: _role(1, 500, "forward microbatch 4, stage 1", 50),
        4: _role(4, 200, "forward microbatch 1, stage 4", 20),
    }
    assert shortcuts.interpolable(roles, plan)
    assert shortcuts.interpolated(roles, plan, 3, [3]).peak_at.startswith(
        "forward microbatch 2, stage 3"
    )
    # peaks at different points: the middle ranks are simulated instead
    roles = {
        1: _role(1, 500, "backward microbatch 1, stage 1", 50),
        4: _role(4, 200, "backward microbatch 7, stage 4", 20),
    }
    assert not shortcuts.interpolable(roles, plan)


@pytest.mark.parametrize(
    "env,message",
    [
        (
            {"TITAN_MEMORY_WORKERS": "abc"},
            "TITAN_MEMORY_WORKERS=abc: must be an integer >= 1 (processes the memory"
            " prediction runs its simulations in; 1 = this one); unset it for the default",
        ),
        ({"TITAN_MEMORY_WORKERS": "0"}, "TITAN_MEMORY_WORKERS=0: must be an integer >= 1"),
        (
            {"TITAN_MEMORY_EXACT_LIMIT": "-3"},
            "TITAN_MEMORY_EXACT_LIMIT=-3: must be an integer >= 0",
        ),
    ],
)
def test_bad_memory_environment_is_one_line(env, message):
    from torchtitan.checks.job import check_memory_env
    from torchtitan.config import ConfigError

    with pytest.raises(ConfigError) as e:
        check_memory_env(env)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)
    check_memory_env(
        {"TITAN_MEMORY_WORKERS": "2", "TITAN_MEMORY_EXACT_LIMIT": "0"}
    )  # valid: no error


def test_extrapolation_follows_the_peak_before_the_tail_and_the_one_in_it_apart():
    """Small variants may peak in the optimizer (Muon's exchange grows with the blocks) while
    the real job peaks in backward: each point along its own line, the larger taken."""

    def role(body: int, tail: int) -> RolePrediction:
        points = {
            "body": (body, {"activations": body}, "backward microbatch 1, stage 1"),
            "tail": (tail, {"optimizer_transients": tail}, "optimizer"),
        }
        peak, at = (tail, "optimizer") if tail > body else (body, "backward microbatch 1, stage 1")
        return RolePrediction("pp1", [1], 1, [1], peak, peak, at, {}, points=points)

    # 1 block: body 100, tail 120; 2 blocks: body 150, tail 140 -> at 16 blocks: body 850
    # (+50 per block), tail 420 (+20): the backward point, though neither variant peaked there
    # by as much
    r1, r2 = role(100, 120), role(150, 140)
    out = shortcuts.extrapolated(r1, r2, [16])
    assert out.predicted_peak_bytes == 850 and out.breakdown == {"activations": 850}
    assert (
        out.peak_at == "backward microbatch 1, stage 1 (extrapolated from 1 and 2 blocks per stage)"
    )
    # both variants peak in the tail and it stays the larger: the tail's line
    out = shortcuts.extrapolated(role(100, 200), role(110, 300), [4])
    assert out.predicted_peak_bytes == 500 and out.peak_at.startswith("optimizer (extrapolated")
