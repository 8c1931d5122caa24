"""SimpleFSDP and fsdp_ac_policy, judged by counts, bytes and losses of real runs: 2 ranks
(dp_shard 2), and 4 for TP (dp_shard 2 x tp 2) and the memory comparison (dp_shard 4).

The tiny Llama3 has 4 blocks of 9 parameters; SimpleFSDP gathers per FSDP unit (one
all-gather of the block's flat shards), so a block whose gather is recomputed adds exactly
1 backward all-gather over dp_shard.
"""

import json
import os
import subprocess

import pytest
import run_tests

BASE = [
    "--model.flavor=tiny",
    "--training.steps=3",
    "--training.seq_len=64",
    "--training.local_batch_size=2",
    "--training.mixed_precision_param=float32",
    "--training.deterministic=true",
    "--metrics.enable_tensorboard=false",
    "--metrics.comm_stats=true",
]
SIMPLE = "--parallelism.fsdp_implementation=simple_fsdp"
NEVER = "--parallelism.reshard_after_forward=never"
AC = {
    "op": [
        "--activation_checkpoint.mode=selective",
        "--activation_checkpoint.selective_ac_option=op",
    ],
    "layer": [
        "--activation_checkpoint.mode=selective",
        "--activation_checkpoint.selective_ac_option=2",
    ],
    "full": ["--activation_checkpoint.mode=full"],
}
GATHERS_PER_BLOCK = 1  # one flat gather per unit, not one per parameter (9)
_RUNS: dict[tuple, list[dict]] = {}


def run(tmp_path_factory, *args: str, ngpu: int = 2, extra: tuple = ()) -> list[dict]:
    key = (ngpu, args, extra)
    if key not in _RUNS:
        dump = tmp_path_factory.mktemp("run")
        rc, _, out = run_tests.launch(
            ngpu, [*BASE, *args, *extra, f"--job.dump_folder={dump}"], str(dump / "ranks")
        )
        assert rc == 0, out[-3000:]
        _RUNS[key] = [json.loads(x) for x in (dump / "metrics.jsonl").read_text().splitlines()]
    return _RUNS[key]


def bwd_gathers(records, dim="dp_shard") -> int:
    counts = {r["comm"].get(f"backward/all_gather/{dim}", 0) for r in records}
    assert len(counts) == 1, counts  # the same every step
    return counts.pop()


def losses(records) -> list[float]:
    return [r["loss"] for r in records]


@pytest.mark.parametrize("ac", ["op", "layer", "full"])
def test_save_keeps_zero2_under_ac_and_recompute_regathers(tmp_path_factory, ac):
    auto = run(tmp_path_factory, SIMPLE, NEVER, *AC[ac])
    save = run(
        tmp_path_factory, SIMPLE, NEVER, *AC[ac], "--activation_checkpoint.fsdp_ac_policy=save"
    )
    recompute = run(
        tmp_path_factory, SIMPLE, NEVER, *AC[ac], "--activation_checkpoint.fsdp_ac_policy=recompute"
    )
    regions = 2 if ac == "layer" else 4  # layer SAC every 2nd block checkpoints blocks 0 and 2
    assert bwd_gathers(auto) == bwd_gathers(save) == 0
    assert bwd_gathers(recompute) == regions * GATHERS_PER_BLOCK
    assert losses(auto) == losses(save) == losses(recompute)
    if ac == "op":  # same math as no AC at all, and as FSDP2 with the same AC
        assert losses(auto) == losses(run(tmp_path_factory, SIMPLE, NEVER))
        assert (
            run_tests.max_rel_diff(losses(auto), losses(run(tmp_path_factory, NEVER, *AC["op"])))
            <= 1e-5
        )


def test_auto_follows_the_reshard_plan(tmp_path_factory):
    # reshard auto (no PP): embeddings and blocks 0-2 reshard, block 3 and the root do not.
    # The embeddings are freed after forward too, but their backward needs only the token
    # ids, never the weight, so their saved-tensor hooks never gather them again.
    records = run(tmp_path_factory, SIMPLE, *AC["op"])
    assert bwd_gathers(records) == 3 * GATHERS_PER_BLOCK
    # one all-gather in forward and one reduce-scatter per unit (embeddings, 4 blocks, root),
    # however many parameters each holds
    for r in records:
        assert (
            r["comm"]["forward/all_gather/dp_shard"]
            == r["comm"]["backward/reduce_scatter/dp_shard"]
            == 6
        )


def test_ac_modes_and_policies_are_bitwise_identical_and_match_fsdp2(tmp_path_factory):
    # (the runs of the test above, and SimpleFSDP without AC)
    simple = [
        losses(run(tmp_path_factory, SIMPLE, NEVER, *AC[ac])) for ac in ("op", "layer", "full")
    ]
    simple.append(losses(run(tmp_path_factory, SIMPLE, NEVER)))
    assert all(x == simple[0] for x in simple)
    fsdp2 = losses(run(tmp_path_factory, NEVER, *AC["op"]))
    assert run_tests.max_rel_diff(simple[0], fsdp2) <= 1e-5


# Compiled: in `make test` full AC with the aot_eager backend (AOTAutograd's partitioner, which
# decides what the compiled backward recomputes, without inductor's code generation); inductor
# under every AC mode with --slow. (Inductor itself in `make test`: the fsdp_compile parity case.)
COMPILED = [
    ("aot_eager", "full"),
    *[pytest.param("inductor", ac, marks=pytest.mark.slow) for ac in ("op", "full", "layer")],
]
BACKEND = {"inductor": (), "aot_eager": ("--compile.backend=aot_eager",)}


@pytest.mark.parametrize("backend, ac", COMPILED)
def test_compiled_policy_is_honoured(tmp_path_factory, backend, ac):
    # Whole-block recompute (full AC, layer SAC) compiles too: no DTensor enters the compiled
    # region (the unit's shards come in as plain tensors), and the gather is one op.
    extra = ("--compile.enable=true", *BACKEND[backend])
    auto = run(tmp_path_factory, SIMPLE, NEVER, *AC[ac], extra=extra)
    assert bwd_gathers(auto) == 0
    eager = losses(run(tmp_path_factory, SIMPLE, NEVER, *AC["op"]))
    assert run_tests.max_rel_diff(losses(auto), eager) <= 1e-5


@pytest.mark.parametrize("backend, ac", COMPILED)
def test_compiled_recompute_policy_regathers(tmp_path_factory, backend, ac):
    extra = ("--compile.enable=true", *BACKEND[backend])
    auto = run(tmp_path_factory, SIMPLE, NEVER, *AC[ac], extra=extra)
    recompute = run(
        tmp_path_factory,
        SIMPLE,
        NEVER,
        *AC[ac],
        "--activation_checkpoint.fsdp_ac_policy=recompute",
        extra=extra,
    )
    assert bwd_gathers(recompute) == (2 if ac == "layer" else 4) * GATHERS_PER_BLOCK
    assert losses(auto) == losses(recompute)


def test_tp_collectives_untouched_by_the_policy(tmp_path_factory):
    tp = ("--parallelism.tensor_parallel_degree=2",)
    runs = {
        pol: run(
            tmp_path_factory,
            SIMPLE,
            NEVER,
            *AC["op"],
            f"--activation_checkpoint.fsdp_ac_policy={pol}",
            extra=tp,
            ngpu=4,
        )
        for pol in ("auto", "recompute")
    }  # (save = auto under never)
    fsdp2 = run(tmp_path_factory, NEVER, *AC["op"], extra=tp, ngpu=4)
    tp_bwd = {pol: bwd_gathers(r, "tp") for pol, r in runs.items()}
    assert len(set(tp_bwd.values())) == 1 and tp_bwd["auto"] == bwd_gathers(fsdp2, "tp") > 0
    assert bwd_gathers(runs["auto"]) == 0
    assert bwd_gathers(runs["recompute"]) == 4 * GATHERS_PER_BLOCK
    assert losses(runs["auto"]) == losses(runs["recompute"])
    assert (
        run_tests.max_rel_diff(losses(runs["auto"]), losses(fsdp2)) <= 1e-5
    )  # SimpleFSDP + TP = FSDP2 + TP


# The debug model with a short sequence: its parameters (the shard degree's share) weigh as
# much as its activations, so a per-unit copy of the local shards would show at once.
DEBUG = (
    "--model.flavor=debugmodel",
    "--training.steps=1",
    "--training.seq_len=32",
    "--training.local_batch_size=1",
    "--metrics.held_for_backward=true",
    "--metrics.comm_stats=false",
)


@pytest.mark.parametrize("ngpu", [2, pytest.param(4, marks=pytest.mark.slow)])  # ~20 s each
def test_memory_held_for_backward_at_most_fsdp2(tmp_path_factory, ngpu):
    # SimpleFSDP keeps the same gathered parameters as FSDP2 under reshard never (and frees
    # the embeddings', whose backward needs only the token ids); the local shards are the
    # parameters themselves, alive before and after the step, never held for backward.
    simple = run(tmp_path_factory, SIMPLE, NEVER, *AC["op"], extra=DEBUG, ngpu=ngpu)[-1]
    fsdp2 = run(tmp_path_factory, NEVER, *AC["op"], extra=DEBUG, ngpu=ngpu)[-1]
    held = simple["held_for_backward_bytes"], fsdp2["held_for_backward_bytes"]
    assert 0 < held[0] <= held[1], held
    assert run_tests.max_rel_diff([simple["loss"]], [fsdp2["loss"]]) <= 1e-5


@pytest.mark.slow
def test_pipeline_auto_gathers_nothing_in_backward(tmp_path_factory):
    pp = ("--parallelism.pipeline_parallel_degree=2", "--training.local_batch_size=4")
    records = run(tmp_path_factory, SIMPLE, *AC["op"], extra=pp)
    assert bwd_gathers(records[1:]) == 0
    fsdp2 = run(tmp_path_factory, *AC["op"], extra=pp)
    assert run_tests.max_rel_diff(losses(records), losses(fsdp2)) <= 1e-5


@pytest.mark.parametrize(
    "args, first_words",
    [
        (
            [
                SIMPLE,
                "--parallelism.reshard_after_forward=always",
                "--activation_checkpoint.fsdp_ac_policy=save",
            ],
            "error: --activation_checkpoint.fsdp_ac_policy=save contradicts --parallelism.reshard_after_forward=always",
        ),
        (
            ["--activation_checkpoint.fsdp_ac_policy=recompute"],
            "error: --activation_checkpoint.fsdp_ac_policy=recompute needs --parallelism.fsdp_implementation=simple_fsdp",
        ),
    ],
)
def test_contradictions_are_refused(tmp_path, args, first_words):
    env = {**os.environ, "NGPU": "2"}
    proc = subprocess.run(
        [run_tests.RUN_TRAIN, *args, f"--job.dump_folder={tmp_path / 'x'}"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and proc.stderr.startswith(first_words), proc.stderr
    assert proc.stderr.count("\n") == 1 and not (tmp_path / "x").exists()
