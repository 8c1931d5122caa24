"""The layout search end to end (`--job.dry_run=true --planning.fit=layout`, a 4-rank tiny job):
it lists fitting layouts fastest first with overrides the checks accept, writes the best as
a TOML snippet that loads as that layout, and times many-microbatch pipelines through the
real count's schedule exactly as a simulation of that count would. (Its torch-free stages:
tests/unit/test_layout_search.py; the pick measured on this machine:
scripts/layout_pick_check.py.)"""

import json
import os
import re
import subprocess
import sys

import run_tests

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = [
    "--model.flavor=tiny",
    "--training.seq_len=64",
    "--training.local_batch_size=2",
    "--training.device=cpu",
    "--training.mixed_precision_param=float32",
    "--metrics.enable_tensorboard=false",
    "--hardware.profile=h100_sxm",
    "--planning.memory_budget_gib=2",
]


def test_the_search_lists_fitting_layouts_and_writes_the_best(tmp_path):
    rc, _, out = run_tests.launch(
        4,
        [
            *TINY,
            "--job.dry_run=true",
            "--planning.fit=layout",
            "--planning.layout_candidates=2",
            f"--job.dump_folder={tmp_path}",
        ],
        str(tmp_path / "ranks"),
    )
    assert rc == 0, out[-3000:]
    assert re.search(
        r"layout search: [\d,]+ layouts enumerated, [\d,]+ within the model-states floor", out
    ), out[-3000:]
    assert "certificate: the pick is the fastest of the " in out
    result = json.loads((tmp_path / "layout_search.json").read_text())
    pick, simulated = result["pick"], result["simulated"]
    assert result["global_batch"] == 8 and result["scored"] >= result["feasible"] >= len(simulated)
    assert 1 <= len(simulated) <= 2  # planning.layout_candidates
    # the layout as configured has no special place: simulated only if chosen
    assert sum(1 for c in simulated if c["configured"]) <= 1
    # the pick: the first simulated (composed ranking order) whose full prediction fits
    ranks = [c["rank"] for c in simulated]
    assert ranks == sorted(ranks)
    first_fit = next(c for c in simulated if c["predicted_peak_bytes"] <= 2 * 2**30)
    assert pick["layout"] == first_fit["layout"]
    from torchtitan.checks import load_config
    from torchtitan.checks.job import accepts

    for c in simulated:
        cfg, _ = load_config(["--job.dry_run=true", *TINY, *c["overrides"]], 4)
        assert accepts(4)(cfg)
    # the snippet is the best layout
    snippet = (tmp_path / "best_layout.toml").read_text()
    assert "[parallelism]" in snippet and "[activation_checkpoint]" in snippet
    best = pick["overrides"]
    for flag in best:
        key, value = flag[2:].split("=", 1)
        name = key.split(".", 1)[1]
        assert re.search(rf"^{name} = ", snippet, re.M), (name, snippet)
    assert pick["layout"] + "  <- pick" in out


def _steps(pairs: list[tuple[list[str], list[str] | None]]) -> list[float]:
    """The predicted step time of each (simulated job, timed_as job), in one fresh process."""
    code = f"""
from torchtitan.checks import load_config
from torchtitan.hardware import PROFILES
from torchtitan.planning.memory.predict import predict_roles
from torchtitan.training.build import fake_world, model_on_meta
from torchtitan.training.planned_job import PlannedJob
meta = None
for argv, timed_as in {pairs!r}:
    cfg, _ = load_config(argv, 4)
    real = load_config(timed_as, 4)[0] if timed_as else None
    meta = meta or model_on_meta(cfg)
    with fake_world(cfg, 4) as dims:
        job = PlannedJob(cfg, meta, dims, "cpu")
        roles, _ = predict_roles(job, hardware=PROFILES["h100_sxm"],
                                 timed_as=job.with_config(real) if real else None)
    print("STEP", repr(max(r.time.predicted_step_seconds for r in roles)))
"""
    env = {**os.environ, "TITAN_MEMORY_WORKERS": "1", "PYTHONPATH": ROOT}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [float(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("STEP ")]


def test_a_pipeline_is_timed_through_another_microbatch_count_as_its_simulation():
    base = [*TINY, "--job.dry_run=true", "--parallelism.pipeline_parallel_degree=2"]
    pairs = []
    for schedule, fewest in (("1F1B", 2), ("Interleaved1F1B", 4)):
        job = [*base, f"--parallelism.pipeline_parallel_schedule={schedule}"]
        few = job + [f"--training.local_batch_size={fewest}"]
        many = job + [f"--training.local_batch_size={2 * fewest}"]
        pairs += [(few, few), (few, None), (few, many), (many, None)]
    steps = _steps(pairs)
    for i in (0, 4):  # 1F1B, Interleaved1F1B
        few_as_few, few, few_as_many, many = steps[i : i + 4]
        # the order generated for the simulated count is the simulated schedule's order
        assert few_as_few == few
        # a simulation of more microbatches is timed like the fewer, run through its order
        assert abs(few_as_many - many) <= 0.02 * many, (i, few_as_many, many)
        assert many > few


def test_layouts_one_after_another_each_in_a_fresh_world():
    """The search simulates one layout after another in one process; DTensor caches sharding
    decisions by device meshes that compare equal across fake worlds, so each layout runs in
    a forked child of its own (planning/search/child.in_child), or the next TP layout would name a
    destroyed process group. Float8 layouts (the search's float8 choice) too."""
    code = f"""
import torch.distributed as dist
from torchtitan.checks import load_config
from torchtitan.planning.search import compose
from torchtitan.planning.search import search as layout_search
from torchtitan.planning.search import space as layout_space
from torchtitan.hardware import PROFILES
from torchtitan.training.build import model_on_meta
from torchtitan.distributed.job_shape import Degrees, degrees
from torchtitan.training.planned_job import PlannedJob
cfg, _ = load_config({[*TINY, "--job.dry_run=true"]!r}, 4)
meta = model_on_meta(cfg)
for tp, cp, f8 in ((2, 1, None), (2, 2, None), (2, 1, None), (2, 1, True)):
    d = Degrees(1, 4 // (tp * cp), tp, 1, 1, 4, cp)
    lay = layout_space.Layout(d, "", 1, "op", "auto", 2, (), f8)
    c = layout_search.Candidate(lay, compose.Composed(1.0, 1.0, 0, {{}}), 1, 0)
    layout_search._full(PlannedJob(cfg, meta, degrees(cfg, 4), "cpu"), PROFILES["h100_sxm"], c)
    print("TPS", repr(c.tokens_per_second), dist.is_initialized())
"""
    env = {**os.environ, "TITAN_MEMORY_WORKERS": "1", "PYTHONPATH": ROOT}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line.split() for line in done.stdout.splitlines() if line.startswith("TPS ")]
    assert [line[2] for line in lines] == [
        "False"
    ] * 4  # the search's own process never joins a world
    assert float(lines[0][1]) == float(lines[2][1]) > 0
    # the float8 choice (planning.layout_float8=choose) simulated in full: TP 2 with torchao's
    # float8 styles (at the tiny model's sizes its casts cost more than its GEMMs save)
    assert 0 < float(lines[3][1]) != float(lines[0][1])
