"""plan_pipeline: upstream's weighted split (the embedding and the output each count as
blocks), layers_per_stage, split points, module_fqns_per_model_part, CSV schedules, stage
placement (loop / V order), every PipelineLayoutError, the splits of upstream's suite on its
6-block debug models, and how errors surface through the config as ConfigError."""

import math
import typing

import pytest

from torchtitan.checks import check_job as validate
from torchtitan.checks import load_config
from torchtitan.config import ConfigError, build_config
from torchtitan.config import job_config as jc
from torchtitan.config.manager import field_types
from torchtitan.distributed.pipeline_layout import (
    SINGLE_STAGE,
    V_SCHEDULES,
    ZERO_BUBBLE,
    PipelineLayout,
    PipelineLayoutError,
    pipeline_layout,
    plan_pipeline,
    weighted_split,
)

KEY = "--parallelism.pipeline_parallel"
FQNS = "--parallelism.module_fqns_per_model_part"
# every schedule --parallelism.pipeline_parallel_schedule accepts
SCHEDULES = list(typing.get_args(field_types(jc.Parallelism)["pipeline_parallel_schedule"]))
CSV = "tests/assets/custom_schedule.csv"  # upstream's: 2 ranks x stages (r, r + 2), 8 microbatches


def layout_error(*args, **kw) -> str:
    with pytest.raises(PipelineLayoutError) as info:
        plan_pipeline(*args[:5], n_microbatches=args[5], **kw)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def config_error(argv, world_size) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(argv, world_size)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def sizes(layout: PipelineLayout) -> list[int]:
    return [len(s) for s in layout.stages]


def test_schedule_families():
    assert SINGLE_STAGE == ("GPipe", "1F1B")
    assert V_SCHEDULES == ("ZBVZeroBubble", "DualPipeV")
    # a CSV schedule may split backward into I and W: treated as zero-bubble (FSDP, compile)
    assert ZERO_BUBBLE == (
        "InterleavedZeroBubble",
        "ZBVZeroBubble",
        "DualPipeV",
        "PipelineScheduleMulti",
    )
    assert issubclass(PipelineLayoutError, ValueError)


# --------------------------------------------------------------------------- the weighted split


@pytest.mark.parametrize(
    "n_layers,n_stages,first,last,expected",
    [
        (6, 2, 1, 1, [3, 3]),  # 8 "layers": 4 + 4, each end one short
        (6, 4, 1, 1, [1, 2, 2, 1]),
        (6, 8, 1, 1, [0, 1, 1, 1, 1, 1, 1, 0]),  # the ends hold only the embedding / output
        (4, 4, 1, 1, [1, 2, 1, 0]),  # 6 over 4: 2 2 1 1, the extra ones to the first stages
        (4, 2, 1, 1, [2, 2]),
        (7, 2, 1, 1, [4, 3]),  # 9: 5 + 4
        (32, 4, 1, 1, [8, 9, 8, 7]),  # 34: 9 9 8 8
        (6, 2, 0, 0, [3, 3]),
        (6, 3, 0, 0, [2, 2, 2]),
        (4, 2, 2, 0, [1, 3]),
        (6, 2, 2, 2, [3, 3]),  # 10: 5 + 5
        (5, 1, 1, 1, [5]),
    ],
)
def test_weighted_split(n_layers, n_stages, first, last, expected):
    stages = weighted_split(n_layers, n_stages, first, last)
    assert [len(s) for s in stages] == expected
    assert [b for s in stages for b in s] == list(range(n_layers))  # every block once, in order


def test_weighted_split_errors():
    with pytest.raises(PipelineLayoutError) as info:
        weighted_split(4, 8)
    assert str(info.value) == (
        f"8 pipeline stages for 4 layers + 1 ({KEY}_first_stage_less_layers) + 1"
        f" ({KEY}_last_stage_less_layers): more stages than that; use fewer stages ({KEY}_degree,"
        f" {KEY}_layers_per_stage)"
    )
    with pytest.raises(PipelineLayoutError) as info:
        weighted_split(6, 4, 3, 1)  # 10 over 4: 2 per stage < 3
    assert str(info.value) == (
        f"{KEY}_first_stage_less_layers=3 exceeds the 2 layers per stage of 4 stages over 6 layers"
        " (+3+1); lower it or use fewer stages"
    )
    with pytest.raises(PipelineLayoutError) as info:
        weighted_split(6, 4, 1, 3)
    assert str(info.value).startswith(f"{KEY}_last_stage_less_layers=3 exceeds the 2 layers")
    with pytest.raises(PipelineLayoutError) as info:
        weighted_split(6, 2, -1, 1)
    assert str(info.value) == f"{KEY}_first_stage_less_layers=-1: must be >= 0"


# --------------------------------------------------------------------------- default stage counts


@pytest.mark.parametrize(
    "n_layers,pp,schedule,expected",
    [
        (8, 4, "GPipe", [2, 3, 2, 1]),  # 10 over 4: 3 3 2 2
        (8, 4, "1F1B", [2, 3, 2, 1]),
        (6, 2, "1F1B", [3, 3]),
        (6, 3, "GPipe", [2, 3, 1]),
        (8, 2, "ZBVZeroBubble", [2, 3, 2, 1]),
        (8, 2, "DualPipeV", [2, 3, 2, 1]),
        (6, 2, "Interleaved1F1B", [1, 2, 2, 1]),  # two stages per rank, as upstream
        (6, 2, "LoopedBFS", [1, 2, 2, 1]),
        (12, 3, "InterleavedZeroBubble", [2, 3, 2, 2, 2, 1]),
        (16, 4, "Interleaved1F1B", [2, 3, 2, 2, 2, 2, 2, 1]),
    ],
)
def test_default_split(n_layers, pp, schedule, expected):
    layout = plan_pipeline(n_layers, pp, schedule, "auto", [], n_microbatches=48)
    per_rank = 1 if schedule in SINGLE_STAGE else 2
    assert sizes(layout) == expected
    assert layout.num_stages == pp * per_rank and layout.stages_per_rank == per_rank
    assert layout.stages == weighted_split(n_layers, pp * per_rank)


def test_pp_one_is_a_single_stage():
    layout = plan_pipeline(5, 1, "1F1B", "auto", [], n_microbatches=1)
    assert layout.stages == ((0, 1, 2, 3, 4),)
    assert layout.stage_ids(0) == [0]


def test_weights_from_the_call():
    layout = plan_pipeline(6, 2, "1F1B", "auto", [], n_microbatches=2, first_less=0, last_less=2)
    assert sizes(layout) == [4, 2]  # 8: 4 + 4, the last stage two short


def test_too_many_stages_for_the_blocks():
    assert layout_error(4, 4, "Interleaved1F1B", "auto", [], 8) == (
        f"8 pipeline stages for 4 layers + 1 ({KEY}_first_stage_less_layers) + 1"
        f" ({KEY}_last_stage_less_layers): more stages than that; use fewer stages ({KEY}_degree,"
        f" {KEY}_layers_per_stage)"
    )


def test_blocks_note():
    layout = plan_pipeline(6, 4, "Interleaved1F1B", "auto", [], n_microbatches=8)
    assert [layout.blocks_note(s) for s in (0, 1, 7)] == ["no blocks", "layers 0", "no blocks"]
    layout = plan_pipeline(6, 2, "1F1B", "auto", [], n_microbatches=2)
    assert layout.blocks_note(1) == "layers 3-5"


# --------------------------------------------------------------------------- layers_per_stage


@pytest.mark.parametrize(
    "n_layers,pp,schedule,lps,expected",
    [
        (6, 4, "Interleaved1F1B", 1, [0, 1, 1, 1, 1, 1, 1, 0]),  # ceil(8 / 1) = 8
        (6, 2, "1F1B", 4, [3, 3]),  # ceil(8 / 4) = 2 (upstream's pp_dp_1f1b)
        (6, 2, "Interleaved1F1B", 2, [1, 2, 2, 1]),  # ceil(8 / 2) = 4
        (14, 2, "LoopedBFS", 2, [1, 2, 2, 2, 2, 2, 2, 1]),  # ceil(16 / 2) = 8
        (10, 2, "ZBVZeroBubble", 3, [2, 3, 3, 2]),  # ceil(12 / 3) = 4
        (6, 1, "GPipe", 8, [6]),  # ceil(8 / 8) = 1
    ],
)
def test_layers_per_stage(n_layers, pp, schedule, lps, expected):
    layout = plan_pipeline(n_layers, pp, schedule, lps, [], n_microbatches=64)
    assert sizes(layout) == expected


@pytest.mark.parametrize("lps", [0, -2])
def test_layers_per_stage_below_one(lps):
    assert layout_error(6, 2, "Interleaved1F1B", lps, [], 8) == (
        f"{KEY}_layers_per_stage={lps}: must be >= 1 (or auto)"
    )


def test_layers_per_stage_not_a_multiple_of_the_degree():
    assert layout_error(6, 2, "Interleaved1F1B", 3, [], 8) == (
        f"{KEY}_layers_per_stage=3 gives ceil((6 layers + 1 + 1) / 3) = 3 stages, not a multiple"
        f" of {KEY}_degree=2; pick layers_per_stage for a multiple"
    )


def test_layers_per_stage_one_stage_per_rank_for_a_multi_stage_schedule():
    assert layout_error(6, 2, "Interleaved1F1B", 4, [], 8) == (
        f"{KEY}_layers_per_stage=4 gives ceil((6 layers + 1 + 1) / 4) = 2 stages, 1 per rank, but"
        f" {KEY}_schedule=Interleaved1F1B runs at least 2 per rank; lower layers_per_stage or use"
        " 1F1B or GPipe"
    )


@pytest.mark.parametrize("schedule", ["GPipe", "1F1B"])
def test_single_stage_schedule_with_two_stages_per_rank(schedule):
    assert layout_error(6, 2, schedule, 2, [], 8) == (
        f"{KEY}_schedule={schedule} runs one stage per rank but the split gives 2;"
        " use Interleaved1F1B or change the split"
    )


@pytest.mark.parametrize("schedule", ["ZBVZeroBubble", "DualPipeV"])
def test_v_schedule_needs_exactly_two_stages_per_rank(schedule):
    # 6 + 2 over 1 per stage: 8 stages, 4 per rank
    assert layout_error(6, 2, schedule, 1, [], 16) == (
        f"{KEY}_schedule={schedule} needs exactly two stages per rank but the split gives 4"
    )


# --------------------------------------------------------------------------- microbatches


@pytest.mark.parametrize(
    "schedule,n_layers,pp,n_stages",
    [("1F1B", 8, 4, 4), ("DualPipeV", 8, 2, 4), ("DualPipeV", 12, 3, 6)],
)
def test_too_few_microbatches(schedule, n_layers, pp, n_stages):
    assert layout_error(n_layers, pp, schedule, "auto", [], n_stages - 1) == (
        f"{KEY}_schedule={schedule} needs at least {n_stages} microbatches (one per stage) but gets"
        f" {n_stages - 1}; raise local_batch_size or lower {KEY}_microbatch_size"
    )
    layout = plan_pipeline(n_layers, pp, schedule, "auto", [], n_microbatches=n_stages)
    assert layout.num_stages == n_stages


@pytest.mark.parametrize("schedule", ["GPipe", "ZBVZeroBubble", "LoopedBFS"])
def test_other_schedules_accept_one_microbatch(schedule):
    assert plan_pipeline(8, 2, schedule, "auto", [], n_microbatches=1).pp == 2


@pytest.mark.parametrize("schedule", ["Interleaved1F1B", "InterleavedZeroBubble"])
@pytest.mark.parametrize("pp,n_mb,rounds", [(2, 5, 2), (2, 7, 3), (4, 9, 2), (4, 11, 2), (3, 7, 2)])
def test_interleaved_microbatch_rounds(schedule, pp, n_mb, rounds):
    assert layout_error(12, pp, schedule, "auto", [], n_mb) == (
        f"{KEY}_schedule={schedule} needs the {n_mb} microbatches to be a multiple of {rounds} rounds;"
        f" use a multiple of {KEY}_degree={pp} microbatches"
    )


@pytest.mark.parametrize("schedule", ["Interleaved1F1B", "InterleavedZeroBubble"])
@pytest.mark.parametrize("pp,n_mb", [(2, 1), (2, 3), (2, 6), (4, 3), (4, 10), (4, 12), (3, 8)])
def test_interleaved_microbatch_counts_that_work(schedule, pp, n_mb):
    # rounds = max(1, n_mb // pp) divides n_mb
    assert plan_pipeline(12, pp, schedule, "auto", [], n_microbatches=n_mb).num_stages == 2 * pp


# --------------------------------------------------------------------------- split points


def test_explicit_split_points():
    layout = plan_pipeline(6, 3, "1F1B", "auto", ["layers.2", "layers.4"], n_microbatches=8)
    assert layout == PipelineLayout(stages=((0, 1), (2, 3), (4, 5)), pp=3, schedule="1F1B")


def test_uneven_split_points_override_layers_per_stage():
    layout = plan_pipeline(6, 3, "GPipe", 2, ["layers.1", "layers.5"], n_microbatches=8)
    assert layout.stages == ((0,), (1, 2, 3, 4), (5,))
    layout = plan_pipeline(
        8, 2, "Interleaved1F1B", 4, ["layers.3", "layers.4", "layers.6"], n_microbatches=8
    )
    assert layout.stages == ((0, 1, 2), (3,), (4, 5), (6, 7))
    assert layout.stage_ids(0) == [0, 2]


def test_split_points_still_checked_against_the_schedule():
    assert layout_error(6, 2, "1F1B", "auto", ["layers.2"], 1) == (
        f"{KEY}_schedule=1F1B needs at least 2 microbatches (one per stage) but gets 1;"
        f" raise local_batch_size or lower {KEY}_microbatch_size"
    )
    assert layout_error(6, 2, "1F1B", "auto", ["layers.2", "layers.4"], 8) == (
        f"3 pipeline stages cannot be spread over {KEY}_degree=2 ranks; make the number of stages a multiple of 2"
    )


@pytest.mark.parametrize(
    "points",
    [
        ["layers.4", "layers.2"],
        ["layers.2", "layers.2"],
        ["layers.0", "layers.3"],
        ["layers.3", "layers.6"],
        ["layers.3", "layers.9"],
        ["layers.-1"],
    ],
)
def test_bad_split_points(points):
    assert layout_error(6, 3, "1F1B", "auto", points, 8) == (
        f"{KEY}_split_points={','.join(points)}: boundaries must increase strictly within layers.1 .. layers.5"
    )


@pytest.mark.parametrize(
    "points", [["layers.x"], ["layers.2", "layers"], ["layers.2", "layers.4b"], [""]]
)
def test_unparseable_split_points(points):
    assert layout_error(6, 3, "1F1B", "auto", points, 8) == (
        f"{KEY}_split_points={','.join(points)}: use block names like layers.2,layers.4"
    )


# --------------------------------------------------------------------------- stage placement


@pytest.mark.parametrize("schedule", ["Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble"])
def test_stage_ids_loop_order(schedule):
    layout = plan_pipeline(16, 2, schedule, 3, [], n_microbatches=8)  # ceil(18 / 3) = 6 stages
    assert [layout.stage_ids(r) for r in range(2)] == [[0, 2, 4], [1, 3, 5]]
    layout = plan_pipeline(8, 4, schedule, "auto", [], n_microbatches=8)  # 8 stages, 2 per rank
    assert [layout.stage_ids(r) for r in range(4)] == [[0, 4], [1, 5], [2, 6], [3, 7]]


@pytest.mark.parametrize("schedule", ["ZBVZeroBubble", "DualPipeV"])
def test_stage_ids_v_order(schedule):
    layout = plan_pipeline(8, 4, schedule, "auto", [], n_microbatches=8)
    assert [layout.stage_ids(r) for r in range(4)] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    layout = plan_pipeline(4, 2, schedule, "auto", [], n_microbatches=4)
    assert [layout.stage_ids(r) for r in range(2)] == [[0, 3], [1, 2]]


@pytest.mark.parametrize("schedule", ["GPipe", "1F1B"])
def test_stage_ids_single_stage(schedule):
    layout = plan_pipeline(8, 4, schedule, "auto", [], n_microbatches=8)
    assert [layout.stage_ids(r) for r in range(4)] == [[0], [1], [2], [3]]


@pytest.mark.parametrize("schedule", [s for s in SCHEDULES if s != "PipelineScheduleMulti"])
def test_every_stage_has_exactly_one_rank(schedule):
    layout = plan_pipeline(24, 3, schedule, "auto", [], n_microbatches=24)
    held = sorted(s for r in range(3) for s in layout.stage_ids(r))
    assert held == list(range(layout.num_stages))
    assert all(len(layout.stage_ids(r)) == layout.stages_per_rank for r in range(3))


def test_layout_is_frozen():
    layout = plan_pipeline(4, 2, "1F1B", "auto", [], n_microbatches=4)
    with pytest.raises(AttributeError):
        layout.pp = 4


# --------------------------------------------------------------------------- through the config


def test_config_rejects_more_stages_than_blocks():
    argv = [
        "--model.flavor=tiny",
        "--parallelism.pipeline_parallel_degree=4",
        "--parallelism.pipeline_parallel_schedule=Interleaved1F1B",
    ]
    assert config_error(argv, 4) == (
        f"8 pipeline stages for 4 layers + 1 ({KEY}_first_stage_less_layers) + 1"
        f" ({KEY}_last_stage_less_layers): more stages than that; use fewer stages ({KEY}_degree,"
        f" {KEY}_layers_per_stage)"
    )


def test_config_accepts_six_layers_on_four_pipeline_ranks():
    # upstream's split: 8 "layers" over 4 stages, 1 2 2 1 blocks (the even split refused it)
    cfg, _ = load_config(
        ["--model.flavor=debugmodel", "--parallelism.pipeline_parallel_degree=4"], 8
    )
    assert sizes(pipeline_layout(cfg.parallelism, 6, 8)) == [1, 2, 2, 1]
    cfg, _ = load_config(
        [
            "--model.flavor=debugmodel",
            "--parallelism.pipeline_parallel_degree=4",
            "--parallelism.pipeline_parallel_split_points=layers.1,layers.3,layers.5",
        ],
        8,
    )
    assert cfg.parallelism.pipeline_parallel_split_points == ["layers.1", "layers.3", "layers.5"]


@pytest.mark.parametrize("mb", [3, 5, 16])
def test_config_microbatch_size_must_divide_the_local_batch(mb):
    argv = [
        "--parallelism.pipeline_parallel_degree=2",
        f"--parallelism.pipeline_parallel_microbatch_size={mb}",
    ]
    assert config_error(argv, 2) == (
        f"--training.local_batch_size=8 does not split into microbatches of"
        f" --parallelism.pipeline_parallel_microbatch_size={mb}; make it a multiple"
    )


def test_config_microbatch_size_zero():
    argv = [
        "--parallelism.pipeline_parallel_degree=2",
        "--parallelism.pipeline_parallel_microbatch_size=0",
    ]
    assert config_error(argv, 2) == (
        "--training.local_batch_size=8 does not split into microbatches of"
        " --parallelism.pipeline_parallel_microbatch_size=0; make it a multiple"
    )


def test_config_microbatch_size_ignored_without_pp():
    cfg, _ = load_config(["--parallelism.pipeline_parallel_microbatch_size=3"], 1)
    assert cfg.parallelism.pipeline_parallel_microbatch_size == 3


def test_config_passes_the_microbatch_count_to_the_layout():
    # local_batch_size 8 / microbatch 4 = 2 microbatches < 3 stages of 1F1B
    argv = [
        "--parallelism.pipeline_parallel_degree=3",
        "--parallelism.pipeline_parallel_microbatch_size=4",
    ]
    assert config_error(argv, 3) == (
        f"{KEY}_schedule=1F1B needs at least 3 microbatches (one per stage) but gets 2;"
        f" raise local_batch_size or lower {KEY}_microbatch_size"
    )
    cfg, _ = load_config(argv + ["--training.local_batch_size=12"], 3)
    assert cfg.training.local_batch_size == 12


@pytest.mark.parametrize("schedule", ["InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"])
def test_config_rejects_always_with_a_zero_bubble_schedule_under_pp(schedule):
    argv = [
        "--parallelism.pipeline_parallel_degree=3",
        f"--parallelism.pipeline_parallel_schedule={schedule}",
        "--parallelism.reshard_after_forward=always",
    ]
    assert config_error(argv, 3) == (
        f"--parallelism.reshard_after_forward=always with --parallelism.pipeline_parallel_schedule={schedule}:"
        " zero-bubble schedules give wrong gradients when FSDP2 reshards after forward (torch 2.13);"
        " use auto or never, or a non-zero-bubble schedule"
    )


@pytest.mark.parametrize(
    "argv,world,policy,budget",
    [
        (
            [
                "--parallelism.pipeline_parallel_schedule=ZBVZeroBubble",
                "--parallelism.reshard_after_forward=always",
            ],
            2,
            "always",
            "auto",
        ),
        (
            [
                "--parallelism.pipeline_parallel_degree=3",
                "--parallelism.pipeline_parallel_schedule=ZBVZeroBubble",
                "--parallelism.reshard_after_forward=never",
            ],
            3,
            "never",
            "auto",
        ),
        # auto + a zero-bubble schedule + a memory budget: whether the budget makes auto reshard
        # (which zero bubble cannot do) is decided at start-up by the memory prediction, not here.
        (
            [
                "--parallelism.pipeline_parallel_degree=3",
                "--parallelism.pipeline_parallel_schedule=ZBVZeroBubble",
                "--planning.memory_budget_gib=1.5",
            ],
            3,
            "auto",
            1.5,
        ),
        (
            [
                "--parallelism.pipeline_parallel_degree=3",
                "--parallelism.pipeline_parallel_schedule=Interleaved1F1B",
                "--parallelism.reshard_after_forward=always",
            ],
            3,
            "always",
            "auto",
        ),
    ],
)
def test_config_accepts_other_reshard_and_schedule_combinations(argv, world, policy, budget):
    cfg, warnings = load_config(argv, world)
    assert warnings == []
    assert cfg.parallelism.reshard_after_forward == policy
    assert cfg.planning.memory_budget_gib == budget


# upstream torchtitan's current spelling (config/upstream.py): accepted without a warning


@pytest.mark.parametrize("old,new", [("default", "auto"), ("always", "always"), ("never", "never")])
def test_upstream_fsdp_reshard_after_forward_on_the_command_line(old, new):
    cfg, warnings = build_config([f"--parallelism.fsdp_reshard_after_forward={old}"])
    assert cfg.parallelism.reshard_after_forward == new
    assert warnings == []


def test_upstream_spelling_in_toml(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text('[parallelism]\nfsdp_reshard_after_forward = "never"\n')
    cfg, warnings = build_config([f"--job.config_file={path}"])
    assert cfg.parallelism.reshard_after_forward == "never"
    assert warnings == []
    # the command line still wins over the TOML value
    cfg, warnings = build_config(
        [f"--job.config_file={path}", "--parallelism.fsdp_reshard_after_forward=default"]
    )
    assert cfg.parallelism.reshard_after_forward == "auto"
    assert warnings == []


@pytest.mark.parametrize("value,hint", [("sometimes", ""), ("alway", " (did you mean 'always'?)")])
def test_upstream_spelling_with_a_bad_value_names_our_key(value, hint):
    with pytest.raises(ConfigError) as info:
        build_config([f"--parallelism.fsdp_reshard_after_forward={value}"])
    assert str(info.value) == (
        f"--parallelism.reshard_after_forward: invalid value '{value}'; choose one of 'auto', 'always', 'never'{hint}"
    )


# --------------------------------------------------------------------------- reshard_budget_gib -> memory_budget_gib


BUDGET_DEPRECATION = (
    "'parallelism.reshard_budget_gib' is deprecated: replaced by 'planning.memory_budget_gib', the whole"
    " predicted peak per rank (it counted only unsharded parameters); its value is taken as the memory budget"
)


LEGACY_AUTO = "'planning.memory_budget_gib = 0' is deprecated: write 'auto' (the device's memory)"
LEGACY_NONE = "'planning.memory_budget_gib = -1' is deprecated: write 'none' (no budget)"


@pytest.mark.parametrize(
    "value,budget,legacy",
    [("1.5", 1.5, []), ("4", 4.0, []), ("0", "auto", [LEGACY_AUTO]), ("-1", "none", [LEGACY_NONE])],
)
def test_deprecated_reshard_budget_on_the_command_line_sets_the_memory_budget(
    value, budget, legacy
):
    cfg, warnings = build_config([f"--parallelism.reshard_budget_gib={value}"])
    assert cfg.planning.memory_budget_gib == budget
    assert warnings == [BUDGET_DEPRECATION, *legacy]
    assert not hasattr(cfg.parallelism, "reshard_budget_gib")
    # and through the whole config check (the value is a valid memory budget)
    cfg, warnings = load_config([f"--parallelism.reshard_budget_gib={value}"], 1)
    assert cfg.planning.memory_budget_gib == budget
    assert warnings == [BUDGET_DEPRECATION, *legacy]


def test_deprecated_reshard_budget_in_toml(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text("[parallelism]\nreshard_budget_gib = 2.5\n")
    cfg, warnings = build_config([f"--job.config_file={path}"])
    assert cfg.planning.memory_budget_gib == 2.5
    assert warnings == [BUDGET_DEPRECATION]
    path.write_text("[parallelism]\nreshard_budget_gib = 3\n")  # a TOML integer
    cfg, warnings = load_config([f"--job.config_file={path}"], 1)
    assert cfg.planning.memory_budget_gib == 3.0 and isinstance(
        cfg.planning.memory_budget_gib, float
    )
    assert warnings == [BUDGET_DEPRECATION]
    # the command line still wins over the TOML value, under either name
    cfg, warnings = build_config([f"--job.config_file={path}", "--planning.memory_budget_gib=none"])
    assert cfg.planning.memory_budget_gib == "none"
    assert warnings == [BUDGET_DEPRECATION]
    cfg, warnings = build_config(
        [f"--job.config_file={path}", "--parallelism.reshard_budget_gib=7"]
    )
    assert cfg.planning.memory_budget_gib == 7.0
    assert warnings == [BUDGET_DEPRECATION, BUDGET_DEPRECATION]


@pytest.mark.parametrize(
    "value,error",
    [
        ("lots", "--planning.memory_budget_gib: expected 'auto' or 'none' or a number, got 'lots'"),
        (
            "nan",
            "--planning.memory_budget_gib: expected 'auto' or 'none' or a finite number, got 'nan'",
        ),
        (
            "-0.5",
            "--planning.memory_budget_gib=-0.5: must be > 0 (GiB per rank), auto (the default budget of the"
            " device) or none (no budget)",
        ),
    ],
)
def test_deprecated_reshard_budget_with_a_bad_value_names_the_new_key(value, error):
    assert config_error([f"--parallelism.reshard_budget_gib={value}"], 1) == error


def budget_error(shown: str) -> str:
    return (
        f"--planning.memory_budget_gib={shown}: must be > 0 (GiB per rank), auto (the default budget of the"
        " device) or none (no budget)"
    )


@pytest.mark.parametrize(
    "value,shown", [("-0.5", "-0.5"), ("-2", "-2"), ("-1.5", "-1.5"), ("-1e-9", "-1e-09")]
)
def test_memory_budget_out_of_range_on_the_command_line(value, shown):
    assert config_error([f"--planning.memory_budget_gib={value}"], 1) == budget_error(shown)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_non_finite_memory_budget_on_the_command_line(value):
    assert config_error([f"--planning.memory_budget_gib={value}"], 1) == (
        f"--planning.memory_budget_gib: expected 'auto' or 'none' or a finite number, got '{value}'"
    )


# (only a value set in code gets here: the command line and TOML refuse non-finite numbers)
@pytest.mark.parametrize(
    "value,shown",
    [(math.nan, "nan"), (math.inf, "inf"), (-math.inf, "-inf"), (-0.5, "-0.5"), (-2.0, "-2")],
)
def test_bad_memory_budget_set_directly(value, shown):
    cfg, _ = build_config([])
    cfg.planning.memory_budget_gib = value
    with pytest.raises(ConfigError) as info:
        validate(cfg, 1)
    assert str(info.value) == budget_error(shown)


@pytest.mark.parametrize(
    "value,budget,warned",
    [
        ("auto", "auto", []),
        ("none", "none", []),
        ("2.5", 2.5, []),
        ("0", "auto", [LEGACY_AUTO]),
        ("-1", "none", [LEGACY_NONE]),
    ],
)
def test_memory_budget_accepted(value, budget, warned):
    cfg, warnings = load_config([f"--planning.memory_budget_gib={value}"], 1)
    assert cfg.planning.memory_budget_gib == budget
    assert warnings == warned
