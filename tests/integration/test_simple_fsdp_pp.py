"""SimpleFSDP under pipeline parallel, judged by collective counts per step and losses:
pp 2 x dp_shard 2 (4 ranks), tiny Llama3, microbatches of 1 sample.

Rank 0 holds stage 0 (tok_embeddings, layers.0, layers.1) under 1F1B, and stages 0 and 3
(tok_embeddings, layers.0; the norm and output, the root) under ZBVZeroBubble, as upstream's
split deals the 4 blocks + embedding + output over 4 stages (1, 2, 1, 0 blocks). A unit the plan keeps
is gathered once per step and reduce-scattered once, whatever the number of microbatches;
a unit it reshards is gathered per microbatch. Step 1 is left out of the counts: the
pipeline's shape inference runs the stage once more (without gradients).
"""

import json

import pytest
import run_tests

BASE = [
    "--model.flavor=tiny",
    "--training.steps=3",
    "--training.seq_len=64",
    "--training.mixed_precision_param=float32",
    "--training.deterministic=true",
    "--metrics.enable_tensorboard=false",
    "--metrics.comm_stats=true",
    "--parallelism.pipeline_parallel_degree=2",
    "--parallelism.pipeline_parallel_microbatch_size=1",
]
SIMPLE = "--parallelism.fsdp_implementation=simple_fsdp"
_RUNS: dict[tuple, list[dict]] = {}


def run(tmp_path_factory, microbatches: int, *args: str) -> list[dict]:
    key = (microbatches, args)
    if key not in _RUNS:
        dump = tmp_path_factory.mktemp("pp")
        rc, _, out = run_tests.launch(
            4,
            [
                *BASE,
                f"--training.local_batch_size={microbatches}",
                *args,
                f"--job.dump_folder={dump}",
            ],
            str(dump / "ranks"),
        )
        assert rc == 0, out[-3000:]
        _RUNS[key] = [json.loads(x) for x in (dump / "metrics.jsonl").read_text().splitlines()]
    return _RUNS[key]


def counts(records) -> set[tuple[int, int, int]]:
    """{(forward all-gathers, backward all-gathers, reduce-scatters) over dp_shard} of steps 2+."""
    return {
        (
            r["comm"].get("forward/all_gather/dp_shard", 0),
            r["comm"].get("backward/all_gather/dp_shard", 0),
            r["comm"].get("backward/reduce_scatter/dp_shard", 0),
        )
        for r in records[1:]
    }


def losses(records) -> list[float]:
    return [r["loss"] for r in records]


# (8 microbatches under 1F1B with --slow; in `make test` 8 under the zero-bubble schedule below)
@pytest.mark.parametrize("microbatches", [4, pytest.param(8, marks=pytest.mark.slow)])
def test_kept_units_gather_once_per_step_whatever_the_microbatches(tmp_path_factory, microbatches):
    records = run(tmp_path_factory, microbatches, SIMPLE)  # reshard auto under PP: every unit kept
    assert counts(records) == {
        (3, 0, 3)
    }  # 3 units: one gather and one reduce-scatter each per step


def test_once_per_step_matches_fsdp2(tmp_path_factory):
    assert (
        run_tests.max_rel_diff(
            losses(run(tmp_path_factory, 4, SIMPLE)), losses(run(tmp_path_factory, 4))
        )
        <= 1e-5
    )


def test_resharded_units_gather_per_microbatch(tmp_path_factory):
    records = run(tmp_path_factory, 4, SIMPLE, "--parallelism.reshard_after_forward=always")
    # 3 units x 4 microbatches in forward; in backward the two blocks again (the embeddings'
    # backward needs no weight); one reduce-scatter per unit and microbatch
    assert counts(records) == {(12, 8, 12)}
    assert losses(records) == losses(run(tmp_path_factory, 4, SIMPLE))  # numerics-neutral


def test_zero_bubble_schedule_once_per_step_and_exact(tmp_path_factory):
    zbv = "--parallelism.pipeline_parallel_schedule=ZBVZeroBubble"  # weight gradients in a separate pass
    simple = run(tmp_path_factory, 8, SIMPLE, zbv)  # 8 microbatches: twice the 1F1B case's 4
    assert counts(simple) == {(3, 0, 3)}  # tok_embeddings, layers.0, the root
    assert run_tests.max_rel_diff(losses(simple), losses(run(tmp_path_factory, 8, zbv))) <= 1e-5
