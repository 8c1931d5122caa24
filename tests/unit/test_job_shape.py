"""job_shape: each degree / batch / microbatch rule stated once, and the config check and the
run (ParallelDims, the trainer's batch, the build path's microbatches) getting the same answer
from it."""

import pytest
from config_helpers import cfg_of, config_error

from torchtitan.distributed.job_shape import (
    ShapeError,
    batch_shape,
    degrees,
    global_batch,
    pipeline_microbatches,
)


def _shape_error(fn, *args) -> str:
    with pytest.raises(ShapeError) as info:
        fn(*args)
    return str(info.value)


@pytest.mark.parametrize(
    "argv, world, expected",
    [
        ([], 8, (1, 8, 1, 1, 1)),
        (
            ["--parallelism.tensor_parallel_degree=2", "--parallelism.pipeline_parallel_degree=2"],
            8,
            (1, 2, 2, 2, 1),
        ),
        (
            [
                "--parallelism.data_parallel_replicate_degree=2",
                "--parallelism.expert_parallel_degree=2",
            ],
            8,
            (2, 4, 1, 1, 2),
        ),
        (["--parallelism.data_parallel_shard_degree=4"], 4, (1, 4, 1, 1, 1)),
    ],
)
def test_degrees_resolve_dp_shard_to_the_rest(argv, world, expected):
    d = degrees(cfg_of(argv), world)
    assert (d.dp_replicate, d.dp_shard, d.tp, d.pp, d.ep) == expected and d.world_size == world
    assert d.dp == d.dp_replicate * d.dp_shard


@pytest.mark.parametrize(
    "argv, world",
    [
        (["--parallelism.tensor_parallel_degree=3"], 8),
        (["--parallelism.data_parallel_shard_degree=3"], 8),
        (["--parallelism.data_parallel_shard_degree=0"], 8),
        (["--parallelism.pipeline_parallel_degree=0"], 8),
    ],
)
def test_the_config_check_says_what_the_rule_says(argv, world):
    # the config check raises the rule's own words (one statement of each rule)
    assert config_error(argv, world) == _shape_error(degrees, cfg_of(argv), world)


def test_parallel_dims_takes_its_degrees_from_the_rule():
    from torchtitan.distributed.parallel_dims import ParallelDims

    cfg = cfg_of(
        ["--parallelism.tensor_parallel_degree=2", "--parallelism.expert_parallel_degree=4"]
    )
    d = ParallelDims.from_config(cfg, 16)
    assert (d.dp_shard, d.ep_from_dp_shard, d.dp) == (8, 2, 8)
    assert _shape_error(
        ParallelDims.from_config, cfg_of(["--parallelism.tensor_parallel_degree=3"]), 16
    ) == (
        "world size 16 is not divisible by data_parallel_replicate_degree x tensor_parallel_degree x"
        " pipeline_parallel_degree = 3; change the degrees or NGPU"
    )


@pytest.mark.parametrize(
    "argv, dp, expected",
    [
        (["--training.local_batch_size=2"], 4, (8, 1, 1)),  # -1: one local batch per dp rank
        (
            ["--training.local_batch_size=2", "--training.global_batch_size=32"],
            4,
            (32, 4, 1),
        ),  # 4 accumulation steps
        (
            [
                "--training.local_batch_size=8",
                "--parallelism.pipeline_parallel_degree=2",
                "--parallelism.pipeline_parallel_microbatch_size=2",
            ],
            2,
            (16, 1, 4),
        ),
    ],
)
def test_batch_shape(argv, dp, expected):
    cfg = cfg_of(argv)
    shape = batch_shape(cfg, dp)
    assert (shape.global_batch, shape.accum_steps, shape.microbatches) == expected
    assert (
        global_batch(cfg, dp) == shape.global_batch
        and pipeline_microbatches(cfg) == shape.microbatches
    )


def test_batch_errors_are_the_config_checks():
    bad_global = ["--training.local_batch_size=2", "--training.global_batch_size=6"]
    assert (
        _shape_error(batch_shape, cfg_of(bad_global), 2)
        == config_error(bad_global, 2)
        == (
            "--training.global_batch_size=6 must be a positive multiple of local_batch_size x data-parallel"
            " degree = 2 x 2 = 4 (or auto)"
        )
    )
    bad_mb = [
        "--training.local_batch_size=3",
        "--parallelism.pipeline_parallel_degree=2",
        "--parallelism.pipeline_parallel_microbatch_size=2",
    ]
    assert (
        _shape_error(pipeline_microbatches, cfg_of(bad_mb))
        == config_error(bad_mb, 2)
        == (
            "--training.local_batch_size=3 does not split into microbatches of"
            " --parallelism.pipeline_parallel_microbatch_size=2; make it a multiple"
        )
    )
