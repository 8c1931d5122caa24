"""The layout search's torch-free stages: the layouts enumerated, their overrides and TOML
snippet (round trips through the config loader), the composed model's pick rules on every
choice, the search's ordering helpers and the schedule orders it times long pipelines with."""

import dataclasses
import tomllib
from types import SimpleNamespace as NS

import pytest

from torchtitan import hardware
from torchtitan.checks import load_config
from torchtitan.checks.job import accepts
from torchtitan.distributed.job_shape import Degrees
from torchtitan.planning.search import compose
from torchtitan.planning.search import search as layout_search
from torchtitan.planning.search import space as layout_space
from torchtitan.planning.search.space import Layout
from torchtitan.planning.step_time import pipeline as pipeline_time

H100 = hardware.PROFILES["h100_sxm"]
DEBUG = [
    "--job.config_file=train_configs/llama3_debug.toml",
    "--job.dry_run=true",
    "--training.device=cpu",
]


def test_split_points_even_with_the_larger_stages_in_the_middle():
    points = layout_space.split_points(126, 8)
    edges = [0, *(int(p.split(".")[1]) for p in points), 126]
    sizes = [b - a for a, b in zip(edges, edges[1:])]
    assert sizes == [15, 16, 16, 16, 16, 16, 16, 15]
    assert layout_space.split_points(8, 4) == ("layers.2", "layers.4", "layers.6")


def test_enumerated_layouts_cover_the_world_and_follow_the_rules():
    layouts = layout_space.enumerate_layouts(16, 8, global_batch=32, seq_len=8192, n_layers=16)
    assert layouts and len(set(layouts)) == len(layouts)
    for lay in layouts:
        d = lay.degrees
        assert d.dp * d.tp * d.pp * d.cp == 16 == d.world_size
        assert d.tp <= 8 and 8192 // d.cp >= layout_space.MIN_CP_TOKENS
        assert (
            32 % (d.dp * lay.local_batch) == 0
        )  # the global batch is kept, accumulation makes up the rest
        assert (lay.schedule in ("1F1B", "Interleaved1F1B")) == (d.pp > 1)
        assert lay.local_batch % lay.microbatch == 0
        if lay.schedule == "Interleaved1F1B":  # two stages per rank, its rounds whole
            assert len(lay.split_points) == 2 * d.pp - 1
            n = lay.local_batch // lay.microbatch
            assert n % max(1, n // d.pp) == 0
        # auto, and the fixed policy auto does not resolve to
        assert (
            lay.reshard in (("auto", "always") if d.pp > 1 else ("auto", "never"))
            or d.dp_shard == 1
        )
        assert d.dp_shard > 1 or lay.reshard == "auto"
    kinds = {
        (lay.degrees.dp_replicate, lay.degrees.dp_shard)
        for lay in layouts
        if lay.degrees.tp == 1 and lay.degrees.pp == 1 and lay.degrees.cp == 1
    }
    assert kinds == {(1, 16), (2, 8), (16, 1)}  # FSDP, HSDP with one group per node, DDP
    assert {lay.ac for lay in layouts} == {"none", "op", "op2", "layer2", "full"}
    assert {lay.schedule for lay in layouts} == {"", "1F1B", "Interleaved1F1B"}
    assert max(lay.degrees.pp for lay in layouts) == 8  # >= 2 blocks per stage


def test_every_enumerated_layout_of_the_debug_job_passes_the_pre_launch_checks():
    """Before: 1F1B layouts with fewer microbatches than stages were enumerated and scored
    (the pick check's spread listed five of its sixteen), and refused at launch."""
    cfg, _ = load_config(DEBUG, 4)
    ok = accepts(4)
    layouts = layout_space.enumerate_layouts(
        4, 1 << 20, global_batch=16, seq_len=cfg.training.seq_len, n_layers=6
    )
    assert any(lay.schedule == "1F1B" for lay in layouts)
    refused = [lay.short() for lay in layouts if not ok(layout_space.apply(cfg, lay, 16))]
    assert refused == []


def test_expert_parallel_degrees_divide_the_experts_and_take_tp_first():
    layouts = layout_space.enumerate_layouts(
        16, 8, global_batch=16, seq_len=4096, n_layers=8, n_experts=8
    )
    eps = {lay.degrees.ep for lay in layouts}
    assert eps == {1, 2, 4, 8}
    assert all(lay.degrees.ep % (lay.degrees.tp * lay.degrees.cp) == 0 for lay in layouts)
    no_experts = layout_space.enumerate_layouts(16, 8, global_batch=16, seq_len=4096, n_layers=8)
    assert {lay.degrees.ep for lay in no_experts} == {1}


DEGREES = ("dp_replicate", "dp_shard", "tp", "pp", "cp", "ep")


def _degrees(dp_replicate=1, dp_shard=2, tp=2, pp=1, cp=1, ep=1) -> Degrees:
    return Degrees(dp_replicate, dp_shard, tp, pp, ep, dp_replicate * dp_shard * tp * pp * cp, cp)


def _layout(**kw) -> Layout:
    base = dict(schedule="", microbatch=1, ac="full", reshard="never", local_batch=2)
    degrees = _degrees(**{k: v for k, v in kw.items() if k in DEGREES})
    return Layout(degrees, **{**base, **{k: v for k, v in kw.items() if k not in DEGREES}})


def _replaced(lay: Layout, **kw) -> Layout:
    """`lay` with some degrees (the world theirs) and other choices changed."""
    d = lay.degrees
    degrees = {k: kw.pop(k, getattr(d, k)) for k in DEGREES}
    return dataclasses.replace(lay, degrees=_degrees(**degrees), **kw)


@pytest.mark.parametrize(
    "lay",
    [
        _layout(),
        _layout(dp_shard=1, dp_replicate=2, ac="op", reshard="auto", local_batch=1),
        _layout(
            tp=1,
            pp=2,
            schedule="1F1B",
            microbatch=1,
            ac="layer2",
            reshard="always",
            local_batch=4,
            split_points=("layers.3",),
        ),
        _layout(float8=True),
        _layout(dp_shard=1, dp_replicate=2, ac="op", float8=False),
    ],
)
def test_overrides_and_toml_snippet_give_the_layout_back(lay, tmp_path):
    cfg, _ = load_config(DEBUG, 4)
    want = layout_space.apply(cfg, lay, 8)
    got, _ = load_config(DEBUG + lay.overrides(8), 4)
    assert got == want
    assert layout_space.layout_of(got, 4, 8, 6, float8_choice=lay.float8 is not None) == lay
    snippet = layout_search.toml_snippet(lay, 8)
    tomllib.loads(snippet)
    path = tmp_path / "best.toml"
    base = open("train_configs/llama3_debug.toml").read()
    path.write_text(_merge(base, snippet))
    from_file, _ = load_config(
        [f"--job.config_file={path}", "--job.dry_run=true", "--training.device=cpu"], 4
    )
    assert (
        from_file.parallelism == want.parallelism
        and from_file.training.local_batch_size == lay.local_batch
    )
    assert from_file.activation_checkpoint == want.activation_checkpoint
    assert from_file.model.converters == want.model.converters
    if lay.float8 is not None:  # the choice is the converter's presence
        assert want.model.converters == (["quantize.linear.float8"] if lay.float8 else [])


def _merge(base: str, snippet: str) -> str:
    """The debug config with the snippet's keys set (TOML has no repeated tables)."""
    data = tomllib.loads(base)
    for section, values in tomllib.loads(snippet).items():
        data.setdefault(section, {}).update(values)
    lines = []

    def table(name: str, values: dict) -> None:
        lines.append(f"[{name}]")
        nested = {k: v for k, v in values.items() if isinstance(v, dict)}
        for k, v in values.items():
            if k not in nested:
                lines.append(f"{k} = {_toml(v)}")
        for k, v in nested.items():  # a nested table ([quantize.linear.float8])
            table(f"{name}.{k}", v)

    for section, values in data.items():
        table(section, values)
    return "\n".join(lines) + "\n"


def _toml(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return str(v)


def _cand(composed_tps: float, full_tps: float) -> layout_search.Candidate:
    got = compose.Composed(1.0, composed_tps, 0, {})
    c = layout_search.Candidate(_layout(), got, 1, 0)
    c.tokens_per_second = full_tps
    return c


def test_disagreement_counts_pairs_ordered_the_other_way():
    assert layout_search.disagreement([_cand(3, 30), _cand(2, 20), _cand(1, 10)]) == 0
    assert layout_search.disagreement([_cand(3, 10), _cand(2, 20), _cand(1, 30)]) == 1
    assert layout_search.disagreement([_cand(3, 20), _cand(2, 30), _cand(1, 10)]) == pytest.approx(
        1 / 3
    )
    assert layout_search.disagreement([_cand(1, 1)]) is None


def test_orders_for_other_microbatch_counts():
    assert pipeline_time.order_for("1F1B", 4, 8) == (
        pipeline_time.single_stage_order("1F1B", 4, 8),
        4,
    )
    order, stages = pipeline_time.order_for("Interleaved1F1B", 2, 4)
    assert stages == 4
    for (
        rank,
        row,
    ) in order.items():  # every (stage, microbatch) of the rank forward and backward once
        mine = {s for s in range(4) if s % 2 == rank}
        assert sorted((s, k, m) for s, k, m in row) == sorted(
            (s, k, m) for s in mine for k in "FB" for m in range(4)
        )
    assert pipeline_time.order_for("ZBVZeroBubble", 2, 4) is None


def test_the_checks_refuse_what_cannot_run_and_bad_search_keys():
    ok = accepts(4)
    cfg, _ = load_config(DEBUG, 4)
    assert ok(layout_space.apply(cfg, _layout(), 8))
    assert not ok(
        layout_space.apply(cfg, _layout(tp=3, dp_shard=1), 8)
    )  # 3 does not divide the world
    from tests.unit.config_helpers import config_error

    assert "--planning.layout_candidates=0" in config_error(
        DEBUG + ["--planning.fit=layout", "--planning.layout_candidates=0"], 4
    )
    assert "--planning.layout_seconds=0" in config_error(
        DEBUG + ["--planning.fit=layout", "--planning.layout_seconds=0"], 4
    )
    no_f8 = ["--planning.layout_float8=choose", "--hardware.profile=a100_80gb"]
    assert config_error(DEBUG + ["--planning.fit=layout", *no_f8], 4) == (
        "--planning.layout_float8=choose: a100_80gb has no float8 tensor cores (SM89 or later);"
        " use --planning.layout_float8=keep or a profile with them"
    )


def test_the_float8_choice_doubles_the_layouts_and_states_the_jobs_own():
    kw = dict(global_batch=16, seq_len=4096, n_layers=8)
    plain = layout_space.enumerate_layouts(8, 8, **kw)
    both = layout_space.enumerate_layouts(8, 8, **kw, float8=(False, True))
    assert {lay.float8 for lay in plain} == {None} and len(both) == 2 * len(plain)
    assert {dataclasses.replace(lay, float8=None) for lay in both} == set(plain)
    assert "| float8" in _layout(float8=True).short() and "float8" not in _layout().short()
    cfg, _ = load_config(DEBUG + ["--model.converters=float8"], 4)
    assert layout_space.layout_of(cfg, 4, 8, 6).float8 is None  # kept: no override
    assert layout_space.layout_of(cfg, 4, 8, 6, float8_choice=True).float8 is True


def _stub_search(monkeypatch, n=60, seed=0):
    """search() over `n` made-up layouts: composed figures random, the full simulation the
    composed one off by up to 20% (peak too), a tenth refused by the checks."""
    import random

    rng = random.Random(seed)
    lays = [
        _replaced(_layout(), local_batch=1 + i % 4, ac=("none", "op", "full")[i % 3])
        for i in range(n)
    ]
    lays = [dataclasses.replace(lay, split_points=(str(i),)) for i, lay in enumerate(lays)]
    figures = {
        lay: (rng.uniform(100, 1000), rng.uniform(10, 80) * 2**30, rng.uniform(0.8, 1.2))
        for lay in lays
    }
    refused = set(rng.sample(lays, n // 10))

    def score(job, hw, budget, log=print):
        cands = [
            layout_search.Candidate(lay, compose.Composed(1.0 / tps, tps, peak, {}), 0, 0)
            for lay, (tps, peak, _) in figures.items()
        ]
        cands.sort(key=lambda c: -c.composed.tokens_per_second_per_device)
        for i, c in enumerate(cands):
            c.rank = i + 1
        return cands, {
            "enumerated": n,
            "within_states": n,
            "enumerate": 0,
            "probe": 0,
            "compose": 0,
        }

    def full(job, hw, cand):
        tps, peak, k = figures[cand.layout]
        cand.tokens_per_second, cand.step_seconds = tps * k, 1.0 / (tps * k)
        cand.peak_bytes, cand.mfu, cand.breakdown = int(peak * k), 0.3, {}

    monkeypatch.setattr(layout_search, "score", score)
    monkeypatch.setattr(layout_search, "_full", full)
    monkeypatch.setattr(layout_space, "apply", lambda cfg, lay, gb: lay)
    job = dataclasses.make_dataclass("J", ["cfg", "batch"])(None, NS(global_batch=16))

    def run(budget_gib, configured=None):
        return layout_search.search(
            job,
            None,
            int(budget_gib * 2**30),
            lambda lay: lay not in refused,
            5,
            configured=configured,
            log=lambda *a, **k: None,
        )

    return run, lays


def test_a_larger_budget_never_returns_a_slower_pick(monkeypatch):
    """The pick is the first layout of the composed ranking that the checks accept and whose
    full simulation fits; the ranking, the checks and the full simulations do not depend on
    the budget, so a larger budget keeps every earlier candidate and never picks slower."""
    for seed in range(5):
        run, _ = _stub_search(monkeypatch, seed=seed)
        picks = []
        for budget in range(12, 90, 3):
            r = run(budget)
            picks.append(r.pick.composed.tokens_per_second_per_device if r.pick else 0.0)
            if r.pick is not None:  # the pick fits, in full, and keeps the headroom composed
                assert r.pick.peak_bytes <= budget * 2**30
                assert r.pick.composed.peak_bytes <= (1 - layout_search.HEADROOM) * budget * 2**30
        assert picks == sorted(picks), (seed, picks)
        assert picks[-1] > picks[0]


def test_the_configured_layout_has_no_place_in_the_pick(monkeypatch):
    run, lays = _stub_search(monkeypatch)
    picks = {run(60, configured=lay).pick.layout for lay in lays[:12]} | {run(60).pick.layout}
    assert len(picks) == 1


def test_the_certificate_names_the_gap_and_the_ties(monkeypatch):
    run, _ = _stub_search(monkeypatch)
    r = run(60)
    text = layout_search.report(r, 16)
    assert f"certificate: the pick is the fastest of the {r.feasible:,} feasible layouts" in text
    assert f"(#{r.pick.rank:,} of {r.scored:,} scored;" in text
    assert "the next best" in text and "ties" in text
    band = max(abs(c.composed.step_seconds / c.step_seconds - 1) for c in r.simulated)
    assert r.band == pytest.approx(band)
    floor = r.pick.composed.tokens_per_second_per_device * (1 - band)
    assert all(c.composed.tokens_per_second_per_device >= floor for c in r.ties)
    assert len(r.simulated) == 5  # planning.layout_candidates (the pick among them)


def test_choosing_float8_probes_the_block_both_ways_and_composes_each_layout_with_its_own(
    monkeypatch,
):
    """planning.layout_float8=choose: every layout scored with float8 off and on, the block
    probed once per choice (the job's converters set accordingly), the float8 layouts composed
    with the converted weights (compose.Float8), the others without."""
    from torchtitan.distributed.job_shape import degrees
    from torchtitan.planning.search import probe as block_probe
    from torchtitan.training.planned_job import PlannedJob, model_on_meta

    cfg, _ = load_config(
        DEBUG
        + [
            "--planning.layout_float8=choose",
            "--quantize.linear.float8.enable_fsdp_float8_all_gather=true",
            "--quantize.linear.float8.filter_fqns=output",
        ],
        4,
    )
    job = PlannedJob(cfg, model_on_meta(cfg), degrees(cfg, 4), "cpu")
    probed, composed = [], []
    fixed = compose.BlockProbe(
        tokens=2048, param_memory_s=0, unit_elements=1, memory_s=0, memory_tp2_s=0,
        memory_cp2_s=0, recompute_s=0, host_s=0, host_tp_s=0, host_cp_s=0, excess_s=0,
        excess_tp_s=0, excess_cp_s=0, rest_memory_s=0, rest_host_s=0, tail_s=0,
        tail_block_s=0, kept_per_token=0, kept_tp2_per_token=0, kept_cp2_per_token=0,
        transient_per_token=0,
    )  # fmt: skip

    def probe(j, hw, acs, model, **kw):
        probed.append((list(j.cfg.model.converters), model.float8))
        return {ac: fixed for ac in acs}

    real = compose.compose

    def spy(lay, m, probes, hw, **kw):
        composed.append((lay.float8, m.float8))
        return real(lay, m, probes, hw, **kw)

    monkeypatch.setattr(block_probe, "probe", probe)
    monkeypatch.setattr(compose, "compose", spy)
    cands, info = layout_search.score(job, H100, 10**12, log=lambda *a, **k: None)
    assert [conv for conv, _ in probed] == [[], ["quantize.linear.float8"]]
    off, on = probed[0][1], probed[1][1]
    assert off is None and on.gather and on.tp and on.wgrad
    assert "attention.wq.weight" in on.names and "output.weight" not in on.names  # filtered
    assert {f8 for f8, _ in composed} == {False, True}
    assert all((m is None) == (f8 is False) for f8, m in composed)
    assert info["enumerated"] == 2 * len(
        {dataclasses.replace(c.layout, float8=None) for c in cands}
    )
