"""The layout search's composed model (planning/search/compose.py) against the dry run's full
simulation it stands in for: on the probe's own layout they must agree (the composition adds
nothing there but the block extrapolation), and on layouts that split what the probe does
not (TP, CP, PP, more ranks) they must stay within the error the search reports as its band.
Each full simulation and each probe runs in a child process (child.in_child)."""

import pytest

from torchtitan.checks import load_config
from torchtitan.distributed.job_shape import Degrees, degrees
from torchtitan.hardware import PROFILES
from torchtitan.planning.memory.model_states import model_shapes
from torchtitan.planning.search import compose
from torchtitan.planning.search import probe as block_probe
from torchtitan.planning.search import search as layout_search
from torchtitan.planning.search import space as layout_space
from torchtitan.training.planned_job import PlannedJob, model_on_meta

H100 = PROFILES["h100_sxm"]
ARGV = [
    "--job.config_file=train_configs/llama3_debug.toml",
    "--job.dry_run=true",
    "--training.seq_len=256",
    "--training.mixed_precision_param=bfloat16",
    "--training.local_batch_size=2",
    "--metrics.enable_tensorboard=false",
]


@pytest.fixture(scope="module")
def setup():
    cfg, _ = load_config(ARGV, 8)
    job = PlannedJob(cfg, model_on_meta(cfg), degrees(cfg, 8), "cuda")
    shapes = model_shapes(cfg.model.name, job.args)
    model = compose.model_of(shapes, job.args)
    probes = block_probe.probe(job, H100, ["none", "full"], model)
    return job, shapes, model, probes


def _both(setup, lay):
    job, shapes, model, probes = setup
    states = layout_search._states(job, shapes, lay, {})
    got = compose.compose(
        lay,
        model,
        probes,
        H100,
        seq=256,
        global_batch=job.batch.global_batch,
        states_bytes=states,
        compiled=False,
    )
    cand = layout_search.Candidate(lay, got, 1, states)
    layout_search._full(job, H100, cand)
    return got, cand


def _lay(ac="none", **kw):
    d = dict(dp_replicate=1, dp_shard=8, tp=1, pp=1, ep=1, world_size=8, cp=1)
    d.update(kw)
    sched = ("1F1B", 1, layout_space.split_points(6, d["pp"])) if d["pp"] > 1 else ("", 1, ())
    return layout_space.Layout(Degrees(**d), sched[0], sched[1], ac, "auto", 2, sched[2])


@pytest.mark.parametrize(
    "kw, bound",
    [
        # measured (2026-12-06): step -2.5% / -2.0% / -2.0% / -1.3% / +14.7%,
        # peak +3.9% / +5.1% / -9.6% / -2.4% / +3.7%; `make test` runs the two ends of the
        # bound (FSDP, PP), the rest with --slow (the suite's time)
        ({}, 0.05),  # FSDP 8: what the probe measured, on 4x the ranks
        pytest.param({"ac": "full"}, 0.05, marks=pytest.mark.slow),
        pytest.param({"dp_shard": 4, "tp": 2}, 0.10, marks=pytest.mark.slow),
        pytest.param({"dp_shard": 4, "cp": 2}, 0.10, marks=pytest.mark.slow),
        ({"dp_shard": 4, "pp": 2}, 0.20),  # 1F1B over 2 stages, local 2: mostly bubble
    ],
)
def test_composed_step_time_stays_near_the_full_simulation(setup, kw, bound):
    got, full = _both(setup, _lay(**kw))
    error = got.step_seconds / full.step_seconds - 1
    assert abs(error) <= bound, (kw, got.step_seconds, full.step_seconds, got.parts, full.breakdown)
    peak_error = got.peak_bytes / full.peak_bytes - 1
    assert abs(peak_error) <= 0.15, (kw, got.peak_bytes, full.peak_bytes)
