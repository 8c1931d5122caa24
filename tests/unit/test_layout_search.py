"""The layout search's torch-free stages: the layouts enumerated, their overrides and TOML
snippet (round trips through the config loader), the cheap estimate's direction on every
choice, the search's ordering helpers and the schedule orders it times long pipelines with."""

import dataclasses
import tomllib

import pytest

from torchtitan import hardware
from torchtitan.checks import load_config
from torchtitan.checks.job import accepts
from torchtitan.distributed.job_shape import Degrees
from torchtitan.planning.memory.model_states import model_shapes
from torchtitan.planning.search import estimate as cheap_step
from torchtitan.planning.search import search as layout_search
from torchtitan.planning.search import space as layout_space
from torchtitan.planning.search.space import Layout
from torchtitan.planning.step_time import model as step_time
from torchtitan.training.model_args import run_model_args

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
        assert (lay.schedule == "1F1B") == (d.pp > 1) and lay.local_batch % lay.microbatch == 0
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
    assert {lay.ac for lay in layouts} == {"none", "op", "layer2", "full"}
    assert max(lay.degrees.pp for lay in layouts) == 8  # >= 2 blocks per stage


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
    ],
)
def test_overrides_and_toml_snippet_give_the_layout_back(lay, tmp_path):
    cfg, _ = load_config(DEBUG, 4)
    want = layout_space.apply(cfg, lay, 8)
    got, _ = load_config(DEBUG + lay.overrides(8), 4)
    assert got == want
    assert layout_space.layout_of(got, 4, 8, 6) == lay
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


def _merge(base: str, snippet: str) -> str:
    """The debug config with the snippet's keys set (TOML has no repeated tables)."""
    data = tomllib.loads(base)
    for section, values in tomllib.loads(snippet).items():
        data.setdefault(section, {}).update(values)
    lines = []
    for section, values in data.items():
        lines.append(f"[{section}]")
        for k, v in values.items():
            lines.append(f"{k} = {_toml(v)}")
    return "\n".join(lines) + "\n"


def _toml(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return str(v)


def _facts(flavor="8B", name="llama3", config="train_configs/llama3_8b.toml"):
    cfg, _ = load_config(
        [f"--job.config_file={config}", "--job.dry_run=true", f"--model.flavor={flavor}"], 8
    )
    args = run_model_args(cfg)
    return cheap_step.model_facts(model_shapes(name, args), args)


def test_cheap_estimate_moves_the_right_way_with_each_choice():
    facts = _facts()

    def est(**kw):
        lay = _replaced(_layout(dp_shard=8, tp=1, ac="none", reshard="auto", local_batch=1), **kw)
        return cheap_step.estimate(
            lay, facts, 10 * 2**30, H100, seq_len=8192, global_batch=16, compiled=False
        )

    none, op, layer2, full = (est(ac=a) for a in ("none", "op", "layer2", "full"))
    assert (
        none.step_seconds < op.step_seconds < layer2.step_seconds < full.step_seconds
    )  # recompute
    assert (
        none.peak_bytes > layer2.peak_bytes > op.peak_bytes > full.peak_bytes
    )  # saved activations
    assert est(reshard="never").peak_bytes > none.peak_bytes  # kept gathered parameters
    assert est(local_batch=2).peak_bytes > none.peak_bytes
    tp = est(dp_shard=4, tp=2, local_batch=2)
    assert tp.parts["comm_tp"] > 0 and tp.peak_bytes < est(local_batch=2).peak_bytes
    assert est(dp_shard=4, cp=2, local_batch=2).parts["comm_cp"] > 0
    # a pipeline's bubble shrinks with its microbatches
    few = est(dp_shard=4, pp=2, schedule="1F1B", local_batch=2)
    many = est(dp_shard=4, pp=2, schedule="1F1B", local_batch=4)
    assert (
        few.parts["bubble"] / few.parts["compute"]
        > many.parts["bubble"] / many.parts["compute"]
        > 0
    )
    # the same work spread over the same devices: tokens/s per device from the step
    assert none.tokens_per_second_per_device == pytest.approx(16 * 8192 / none.step_seconds / 8)
    scaled = none.rescaled(2.0)
    assert scaled.parts["compute"] == pytest.approx(2 * none.parts["compute"])
    assert scaled.step_seconds == pytest.approx(sum(scaled.parts.values()))


def test_cheap_estimate_counts_expert_parallel_all_to_alls():
    facts = _facts("16B", "deepseek_v3", "train_configs/deepseek_v3_16b.toml")
    assert facts.top_k > 1 and facts.moe_inter > 0 and 0 < facts.active_fraction < 1
    lay = _layout(dp_shard=8, tp=1, ep=8, ac="full", reshard="auto", local_batch=1)
    est = cheap_step.estimate(
        lay, facts, 10 * 2**30, H100, seq_len=4096, global_batch=8, compiled=True
    )
    assert est.parts["comm_ep"] > 0
    no_ep = cheap_step.estimate(
        _replaced(lay, ep=1), facts, 10 * 2**30, H100, seq_len=4096, global_batch=8, compiled=True
    )
    assert "comm_ep" not in no_ep.parts


def _cand(cheap_tps: float, full_tps: float) -> layout_search.Candidate:
    est = cheap_step.Estimate(1.0, cheap_tps, 0, {"compute": 1.0}, cheap_tps)
    c = layout_search.Candidate(_layout(), est, 1, 0, scaled=est)
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
    assert step_time.order_for("1F1B", 4, 8) == (step_time.single_stage_order("1F1B", 4, 8), 4)
    order, stages = step_time.order_for("Interleaved1F1B", 2, 4)
    assert stages == 4
    for (
        rank,
        row,
    ) in order.items():  # every (stage, microbatch) of the rank forward and backward once
        mine = {s for s in range(4) if s % 2 == rank}
        assert sorted((s, k, m) for s, k, m in row) == sorted(
            (s, k, m) for s in mine for k in "FB" for m in range(4)
        )
    assert step_time.order_for("ZBVZeroBubble", 2, 4) is None


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
