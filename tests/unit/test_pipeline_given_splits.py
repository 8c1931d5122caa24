"""The pipeline split given outright or by upstream's settings: module_fqns_per_model_part,
CSV schedules (checked as torch's runtime will read them), and the splits of upstream's suite
on its 6-block debug models. The split rules themselves: test_pipeline_layout.py."""

import json
import shlex

import pytest

from tests.integration import upstream_cases
from tests.unit.test_pipeline_layout import CSV, FQNS, KEY, config_error, layout_error, sizes
from torchtitan.checks import load_config
from torchtitan.config import build_config
from torchtitan.distributed.job_shape import pipeline_microbatches
from torchtitan.distributed.pipeline_layout import pipeline_layout, plan_pipeline
from torchtitan.models.flavors import flavors_of

# --------------------------------------------------------------------------- module_fqns_per_model_part


def test_module_fqns_give_the_split():
    parts = [
        ["tok_embeddings", "layers.0"],
        ["layers.1", "layers.2"],
        [],
        ["layers.3", "norm", "output"],
    ]
    layout = plan_pipeline(4, 2, "Interleaved1F1B", 1, ["layers.2"], n_microbatches=4, fqns=parts)
    assert layout.stages == ((0,), (1, 2), (), (3,))  # over layers_per_stage and split points
    assert (layout.first_modules, layout.last_modules) == (("tok_embeddings",), ("norm", "output"))
    # the end modules may go unnamed: they stay on their end stages
    layout = plan_pipeline(
        4,
        2,
        "1F1B",
        "auto",
        [],
        n_microbatches=4,
        fqns=[["layers.0"], ["layers.1", "layers.2", "layers.3"]],
    )
    assert layout.stages == ((0,), (1, 2, 3)) and layout.first_modules == layout.last_modules == ()


@pytest.mark.parametrize(
    "parts,named",
    [
        (
            [["layers.0", "layers.2"], ["layers.1", "layers.3"]],
            "layers.0, layers.2, layers.1, layers.3",
        ),
        ([["layers.0"], ["layers.1", "layers.2"]], "layers.0, layers.1, layers.2"),
        (
            [["layers.0", "layers.1"], ["layers.1", "layers.2", "layers.3"]],
            "layers.0, layers.1, layers.1, layers.2, layers.3",
        ),
        ([["tok_embeddings"], ["norm"]], "none"),
    ],
)
def test_module_fqns_must_hold_every_block_once_in_order(parts, named):
    assert layout_error(4, 2, "1F1B", "auto", [], 4, fqns=parts) == (
        f"{FQNS}: the parts must name layers.0 .. layers.3 once each, in order; they name {named}"
    )


def test_module_fqns_errors():
    assert layout_error(
        4, 2, "1F1B", "auto", [], 4, fqns=[["layers.0.attention"], ["layers.1"]]
    ) == (f"{FQNS}: 'layers.0.attention' is not a block; blocks are layers.0 .. layers.3")
    parts = [["layers.0"], ["layers.1", "norm"], ["layers.2"], ["layers.3"]]
    assert layout_error(4, 2, "Interleaved1F1B", "auto", [], 4, fqns=parts) == (
        f"{FQNS}: part 1 names 'norm'; only blocks go to the middle stages (the embedding goes to"
        " the first part, the norm and output to the last)"
    )
    three = [["layers.0"], ["layers.1"], ["layers.2", "layers.3"]]
    assert layout_error(4, 2, "1F1B", "auto", [], 4, fqns=three) == (
        f"3 pipeline stages cannot be spread over {KEY}_degree=2 ranks; make the number of stages a multiple of 2"
    )


def test_module_fqns_through_the_config():
    parts = [
        ["tok_embeddings", "layers.0", "layers.1"],
        ["layers.2", "layers.3", "layers.4", "layers.5", "norm", "output"],
    ]
    argv = [
        "--model.flavor=debugmodel",
        "--parallelism.pipeline_parallel_degree=2",
        f"--parallelism.module_fqns_per_model_part={json.dumps(parts)}",
    ]
    cfg, _ = load_config(argv, 2)
    assert pipeline_layout(cfg.parallelism, 6, 8).stages == ((0, 1), (2, 3, 4, 5))
    assert config_error([*argv[:2], f'{FQNS}=[["layers.0"], ["layers.2"]]'], 2) == (
        f"{FQNS}: the parts must name layers.0 .. layers.5 once each, in order; they name layers.0, layers.2"
    )


# --------------------------------------------------------------------------- CSV schedules


def test_csv_schedule_of_upstream():
    layout = plan_pipeline(
        4, 2, "PipelineScheduleMulti", "auto", [], n_microbatches=8, csv_path=CSV
    )
    assert layout.csv == CSV and sizes(layout) == [1, 2, 1, 0]
    assert [layout.stage_ids(r) for r in range(2)] == [[0, 2], [1, 3]]


def test_csv_schedule_needs_a_file():
    assert layout_error(4, 2, "PipelineScheduleMulti", "auto", [], 8) == (
        f"{KEY}_schedule=PipelineScheduleMulti runs a schedule from a file: set {KEY}_schedule_csv"
        " (one row of actions per pipeline rank, e.g. tests/assets/custom_schedule.csv)"
    )
    assert layout_error(4, 2, "PipelineScheduleMulti", "auto", [], 8, csv_path="nope.csv") == (
        f"{KEY}_schedule_csv=nope.csv: no such file; give a CSV of pipeline actions, one row per pipeline rank"
    )


def _actions(tmp_path, rows) -> str:
    path = tmp_path / "s.csv"
    path.write_text("\n".join(",".join(r) for r in rows) + "\n")
    return str(path)


def _full(stages, n_mb, backward=("B",)) -> list[str]:
    return [f"{s}F{m}" for s in stages for m in range(n_mb)] + [
        f"{s}{k}{m}" for s in reversed(stages) for m in range(n_mb) for k in backward
    ]


@pytest.mark.parametrize("backward", [("B",), ("I", "W")])
def test_csv_schedules_that_work(tmp_path, backward):
    path = _actions(tmp_path, [_full([0, 2], 2, backward), ["", *_full([1, 3], 2, backward), ""]])
    assert (
        plan_pipeline(
            4, 2, "PipelineScheduleMulti", "auto", [], n_microbatches=2, csv_path=path
        ).csv
        == path
    )
    # a single-stage schedule's placement with a CSV (torch's runtime runs it)
    path = _actions(tmp_path, [_full([0], 2), _full([1], 2)])
    assert plan_pipeline(4, 2, "1F1B", "auto", [], n_microbatches=2, csv_path=path).num_stages == 2


@pytest.mark.parametrize(
    "rows,n_mb,says",
    [
        (
            [_full([0, 2], 2)],
            2,
            "1 rows for --parallelism.pipeline_parallel_degree=2; write one row per pipeline rank",
        ),
        (
            [_full([0, 2], 2), ["1X0"]],
            2,
            "rank 1's action '1X0' is not <stage><F|B|I|W><microbatch> (compute actions only; torch adds the sends and receives)",
        ),
        (
            [_full([0, 2], 2), ["0F0"]],
            2,
            "rank 1 runs 0F0 but holds stages [1, 3] of 4 (the loop placement of --parallelism.pipeline_parallel_schedule=PipelineScheduleMulti)",
        ),
        (
            [_full([0, 2], 2), ["1F2"]],
            2,
            "1F2 names microbatch 2 but a step has 2 (training.local_batch_size / --parallelism.pipeline_parallel_microbatch_size)",
        ),
        (
            [_full([0, 2], 2), ["1B0"]],
            2,
            "rank 1's 1B0 after nothing of stage 1 microbatch 0; each needs F, then B (or I, then W), once each",
        ),
        (
            [_full([0, 2], 2), ["1F0", "1W0"]],
            2,
            "rank 1's 1W0 after F of stage 1 microbatch 0; each needs F, then B (or I, then W), once each",
        ),
        (
            [_full([0, 2], 2), ["1F0", "1F0"]],
            2,
            "rank 1's 1F0 after F of stage 1 microbatch 0; each needs F, then B (or I, then W), once each",
        ),
        (
            [_full([0, 2], 2), _full([1, 3], 1)],
            2,
            "stage 1 microbatch 1 runs nothing; every stage needs F and B (or F, I and W) for every microbatch",
        ),
        (
            [_full([0, 2], 2), [*_full([1, 3], 2, ("I",))]],
            2,
            "stage 1 microbatch 0 runs FI; every stage needs F and B (or F, I and W) for every microbatch",
        ),
    ],
)
def test_csv_schedule_errors(tmp_path, rows, n_mb, says):
    path = _actions(tmp_path, rows)
    msg = layout_error(4, 2, "PipelineScheduleMulti", "auto", [], n_mb, csv_path=path)
    assert msg == f"{KEY}_schedule_csv={path}: {says}"


def test_csv_through_the_config():
    argv = [
        "--model.flavor=debugmodel",
        "--parallelism.pipeline_parallel_degree=2",
        "--parallelism.pipeline_parallel_schedule=PipelineScheduleMulti",
        f"--parallelism.pipeline_parallel_schedule_csv={CSV}",
    ]
    cfg, _ = load_config(argv, 2)
    assert pipeline_layout(cfg.parallelism, 6, 8).csv == CSV
    assert config_error([*argv, "--training.local_batch_size=4"], 2) == (
        f"{KEY}_schedule_csv={CSV}: 0F4 names microbatch 4 but a step has 4"
        f" (training.local_batch_size / {KEY}_microbatch_size)"
    )


# --------------------------------------------------------------------------- upstream's suite

# Upstream's cases with pipeline parallel -> the stages (blocks) of each run, on its 6-block
# debug models (llama3 and deepseek_v3 debugmodel, as here).
ENDS = ((), (0,), (1,), (2,), (3,), (4,), (5,), ())
HALVES = ((0, 1, 2), (3, 4, 5))
FOUR = ((0,), (1, 2), (3, 4), (5,))
UPSTREAM_SPLITS = {
    "pp_looped_zero_bubble": [ENDS],
    "pp_looped_1f1b": [ENDS, ENDS],
    "pp_zbv": [FOUR],
    "pp_1f1b": [HALVES],
    "pp_gpipe": [HALVES],
    "pp_dp_1f1b": [HALVES, HALVES],
    "pp_dp_gpipe": [HALVES],
    "pp_tp": [HALVES],
    "pp_dp_tp": [HALVES, HALVES],
    "3d_compile": [HALVES],
    "pp_custom_csv": [FOUR],
    "validation_tp_cp_pp": [FOUR],
    "pp_dualpipev": [FOUR],
    "deepseek_v3_pp+fsdp+tp+ep": [FOUR],
    "deepseek_v3_pp+fsdp+tp+ep+etp": [FOUR],
    "deepseek_v3_flex+pp+fsdp+ep+sacop": [FOUR],
}


def _upstream_runs(name):
    case = next(
        c for c in [*upstream_cases.FEATURE_CASES, *upstream_cases.MODEL_CASES] if c.name == name
    )
    base = "--job.config_file=tests/upstream/base_config.toml"
    return [[base, *(a for s in run.overrides for a in shlex.split(s))] for run in case.runs]


@pytest.mark.parametrize("name", list(UPSTREAM_SPLITS))
def test_upstream_suite_splits(name):
    runs = _upstream_runs(name)
    assert len(runs) == len(UPSTREAM_SPLITS[name])
    for argv, stages in zip(runs, UPSTREAM_SPLITS[name]):
        cfg, _ = build_config(argv)
        n_layers = flavors_of(cfg.model.name)[cfg.model.flavor].n_layers
        assert n_layers == 6
        layout = pipeline_layout(cfg.parallelism, n_layers, pipeline_microbatches(cfg))
        assert layout.stages == stages, name
