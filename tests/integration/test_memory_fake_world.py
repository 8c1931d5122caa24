"""The memory prediction and the model-states count against simulations on fake process
groups, each in a child process (so that the test process keeps no default group and its
allocator is not the one measured):

- the prediction (fake tensors) against its deterministic reference, the same training step on
  real tensors in one process, measured by the CPU allocator's own events (torch profiler);
  goal: within +/-5% for every pipeline rank (measured: equal to the byte but for AdamW's step
  counters). The matrix of real gloo jobs is scripts/memory_check.py. (memory_worker.py)
- the prediction's shortcuts for large jobs (torchtitan/planning/simulate/roles.py) against
  simulating every role whole: interpolated middle ranks byte-equal, extrapolated blocks
  byte-equal but on the first pipeline rank (within 2%). (shortcut_worker.py)
- model_states' elements per rank against the parallelized build. (model_states_worker.py)

Their pure parts: tests/unit/test_memory_prediction.py, test_memory_shortcuts.py,
test_model_states.py."""

import json
import os
import subprocess
import sys

import pytest

from torchtitan.checks import load_config
from torchtitan.models.flavors import model_args
from torchtitan.planning.memory import model_states

HERE = os.path.dirname(os.path.abspath(__file__))
VOCAB = 2048  # the bundled tokenizer's, for the flavors that take the tokenizer's vocabulary


# --------------------------------------------------------------------------- the prediction against the allocator

TINY = ["--model.flavor=tiny", "--training.seq_len=64", "--training.mixed_precision_param=float32"]
DSV3_TINY = ["--job.config_file=train_configs/deepseek_v3_debug.toml", *TINY]

PREDICTION_CASES = {
    "fsdp2": (2, [*TINY, "--training.local_batch_size=2"]),
    "simple_fsdp": (
        2,
        [*TINY, "--training.local_batch_size=2", "--parallelism.fsdp_implementation=simple_fsdp"],
    ),
    "simple_fsdp_op_sac": (
        2,
        [
            *TINY,
            "--training.local_batch_size=2",
            "--parallelism.fsdp_implementation=simple_fsdp",
            "--activation_checkpoint.mode=selective",
        ],
    ),
    "tp2_full_ac": (
        4,
        [
            *TINY,
            "--training.local_batch_size=2",
            "--parallelism.tensor_parallel_degree=2",
            "--activation_checkpoint.mode=full",
        ],
    ),
    "pp2_1f1b_op_sac": (
        4,
        [
            *TINY,
            "--training.local_batch_size=4",
            "--parallelism.pipeline_parallel_degree=2",
            "--activation_checkpoint.mode=selective",
        ],
    ),
    "ddp_accum": (
        2,
        [
            *TINY,
            "--training.local_batch_size=2",
            "--parallelism.data_parallel_shard_degree=1",
            "--parallelism.data_parallel_replicate_degree=2",
            "--training.global_batch_size=8",
        ],
    ),
    "dsv3_ep2": (
        4,
        [*DSV3_TINY, "--training.local_batch_size=2", "--parallelism.expert_parallel_degree=2"],
    ),
    # Muon over FSDP2 x TP2: one momentum buffer per matrix, the owners' two-hop exchange
    "muon_fsdp2_tp2": (
        4,
        [
            *TINY,
            "--training.local_batch_size=2",
            "--parallelism.tensor_parallel_degree=2",
            "--optimizer.name=Muon",
        ],
    ),
    # context parallel (gathered K/V, chunk masks) with the document mask
    "cp2_block_causal": (
        2,
        [
            *TINY,
            "--training.local_batch_size=2",
            "--parallelism.context_parallel_degree=2",
            "--model.attn_mask=block_causal",
        ],
    ),
}


# A gap of the reference, not of the prediction: on the fake process group the work object of
# SimpleFSDP's all-gather keeps the gather's flat input (a copy of the unit's local shards)
# alive, so the allocator holds one more copy of every local shard than a real gloo run does
# (+9.5% here). On real gloo the prediction is exact to the KiB:
# tests/integration/test_memory_budget.py::test_prediction_against_a_real_gloo_run (in
# `make test`). That the gap is still there (strict xfail): with --slow.
KNOWN_GAPS = {"simple_fsdp", "simple_fsdp_op_sac"}


def _shortcuts(world: int, flavor: str, blocks: int, argv: list[str]) -> dict:
    """shortcut_worker.py's prediction with the shortcuts ("fast") and whole ("full")."""
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(HERE, "shortcut_worker.py"),
            str(world),
            flavor,
            str(blocks),
            *argv,
        ],
        capture_output=True,
        text=True,
        cwd=os.path.dirname(os.path.dirname(HERE)),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(
            n,
            marks=[
                pytest.mark.xfail(strict=True, reason="known gap, see KNOWN_GAPS"),
                pytest.mark.slow,
            ],
        )
        if n in KNOWN_GAPS
        else n
        for n in PREDICTION_CASES
    ],
)
def test_prediction_matches_the_allocator_on_real_tensors(name):
    world, argv = PREDICTION_CASES[name]
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "memory_worker.py"), str(world), *argv],
        capture_output=True,
        text=True,
        cwd=os.path.dirname(os.path.dirname(HERE)),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert rows, proc.stdout[-2000:]
    for row in rows:
        error = (row["predicted"] - row["allocator"]) / row["allocator"]
        assert abs(error) <= 0.05, (name, row)
        # the breakdown accounts for every byte of the peak
        assert sum(row["breakdown"].values()) == row["predicted"], (name, row)


# --------------------------------------------------------------------------- the shortcuts against whole simulations

PP5 = [
    "--training.seq_len=32",
    "--training.mixed_precision_param=float32",
    "--parallelism.pipeline_parallel_degree=5",
    "--parallelism.pipeline_parallel_split_points=layers.2,layers.3,layers.4,layers.5",
]  # (the check's 6 layers)
PP6 = [
    "--training.seq_len=64",
    "--training.mixed_precision_param=float32",
    "--parallelism.pipeline_parallel_degree=6",
]
DSV3_CONFIG = "--job.config_file=train_configs/deepseek_v3_debug.toml"

TIME_BOUND = 0.02  # the extrapolated step time vs the whole simulation's (llama_1f1b: equal)
SHORTCUT_CASES = {  # world, flavor simulated, blocks, overrides
    # Llama3 1F1B: 13 blocks split 2 3 3 3 2 (the ends weigh one block each); rank 2 interpolated
    "llama_1f1b": (5, "tiny", 13, [*PP5, "--training.local_batch_size=5"]),
    # DeepSeek-V3 with EP 2: the worst case too; a dense first stage; peaks at the last warm-up forward
    "dsv3_ep2_1f1b": (
        12,
        "tiny",
        6,
        [
            DSV3_CONFIG,
            *PP6,
            "--training.local_batch_size=6",
            "--parallelism.expert_parallel_degree=2",
        ],
    ),
    "llama_gpipe": (
        6,
        "tiny",
        12,
        [*PP6, "--training.local_batch_size=8", "--parallelism.pipeline_parallel_schedule=GPipe"],
    ),
}


@pytest.mark.parametrize(
    "name",
    [n if n == "llama_1f1b" else pytest.param(n, marks=pytest.mark.slow) for n in SHORTCUT_CASES],
)
def test_shortcuts_equal_full_simulation(name):
    world, flavor, blocks, argv = SHORTCUT_CASES[name]
    out = _shortcuts(world, flavor, blocks, argv)
    interpolated = [r["role"] for r in out["fast"] if "interpolated" in r["peak_at"]]
    assert interpolated == (["pp2"] if world == 5 else ["pp2", "pp3"])  # the shortcuts were taken
    assert all("extrapolated" in r["peak_at"] for r in out["fast"])
    for fast, full in zip(out["fast"], out["full"]):
        assert (fast["ranks"], fast["stages"]) == (full["ranks"], full["stages"])
        for key in ("predicted_peak_bytes", "worst_case_peak_bytes"):
            error = (fast[key] - full[key]) / full[key]
            # Blocks-only ranks: exact. The first rank's peak moves, as blocks are added, from
            # the start of its backward to the embeddings' backward (unsharded block gradients
            # pile up faster than one microbatch's activations): 1- and 2-block runs do not see
            # that, and the extrapolation falls short (README; measured -1.1% here).
            bound = 0.02 if fast["role"] == "pp0" else 0.0
            assert abs(error) <= bound, (name, fast["role"], key, fast[key], full[key])
        # the step time (h100_sxm) is extrapolated action by action from the same runs
        t_fast, t_full = fast["time"], full["time"]
        error = t_fast["predicted_step_seconds"] / t_full["predicted_step_seconds"] - 1
        assert abs(error) <= TIME_BOUND, (name, fast["role"], t_fast, t_full)


def test_step_time_extrapolated_from_blocks_equals_the_whole_simulation_without_pp():
    """Issue 47's bias 7: a job without PP is timed from its 1- and 2-block runs (x125 at
    405B); FSDP 4 over 12 blocks: the extrapolated step time and peak equal the whole
    simulation's (measured: equal to the last digit, 0.1270 s on h100_sxm)."""
    out = _shortcuts(4, "tiny", 12, ["--training.seq_len=256", "--training.local_batch_size=2"])
    ((fast,), (full,)) = out["fast"], out["full"]
    assert "extrapolated" in fast["peak_at"] and "extrapolated" not in full["peak_at"]
    assert fast["time"]["predicted_step_seconds"] == pytest.approx(
        full["time"]["predicted_step_seconds"], rel=1e-9
    )
    assert fast["predicted_peak_bytes"] == full["predicted_peak_bytes"]


# --------------------------------------------------------------------------- model states against the parallelized build

# (world size, overrides): every data-parallel form, TP, PP (one, several and V-ordered stages
# per rank), EP (part of dp_shard, all of it, with TP), uneven splits (3 and 6 ranks)
LLAMA = ["--model.name=llama3", "--model.flavor=tiny"]
DSV3_NAMED = ["--model.name=deepseek_v3", "--model.flavor=tiny"]
PP2 = "--parallelism.pipeline_parallel_degree=2"
FAKE_PG_CASES = [
    (1, LLAMA),
    (3, LLAMA),
    (4, LLAMA + ["--parallelism.data_parallel_replicate_degree=2"]),
    (
        2,
        LLAMA
        + [
            "--parallelism.data_parallel_replicate_degree=2",
            "--parallelism.data_parallel_shard_degree=1",
        ],
    ),
    (6, LLAMA + ["--parallelism.tensor_parallel_degree=2"]),
    (4, LLAMA + [PP2]),
    (
        4,
        LLAMA
        + [
            PP2,
            "--parallelism.pipeline_parallel_schedule=Interleaved1F1B",
            "--parallelism.tensor_parallel_degree=2",
        ],
    ),
    (2, LLAMA + [PP2, "--parallelism.pipeline_parallel_schedule=ZBVZeroBubble"]),
    (2, LLAMA + ["--parallelism.fsdp_implementation=simple_fsdp"]),
    (3, DSV3_NAMED),
    (4, DSV3_NAMED + ["--parallelism.expert_parallel_degree=2"]),
    (4, DSV3_NAMED + ["--parallelism.expert_parallel_degree=4"]),
    (
        8,
        DSV3_NAMED
        + ["--parallelism.tensor_parallel_degree=2", "--parallelism.expert_parallel_degree=4"],
    ),
    (
        4,
        DSV3_NAMED
        + ["--parallelism.tensor_parallel_degree=2", "--parallelism.expert_parallel_degree=2"],
    ),
    (16, DSV3_NAMED + ["--parallelism.expert_parallel_degree=2"]),
    (
        4,
        DSV3_NAMED
        + [
            "--parallelism.data_parallel_replicate_degree=2",
            "--parallelism.expert_parallel_degree=2",
        ],
    ),
    (4, DSV3_NAMED + [PP2, "--parallelism.expert_parallel_degree=2"]),
]


def test_per_rank_states_equal_the_parallelized_model(subprocess_env):
    """The elements each pipeline rank's first data/tensor-parallel rank holds after the real
    build (TP -> EP -> FSDP2 / SimpleFSDP / DDP, on a fake process group) are what
    model_states computes, for every case at once (one child process)."""
    out = subprocess.run(
        [sys.executable, os.path.join(HERE, "model_states_worker.py"), json.dumps(FAKE_PG_CASES)],
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    held = json.loads(out.stdout.strip().splitlines()[-1])
    for (world, argv), real in zip(FAKE_PG_CASES, held):
        cfg, _ = load_config(argv + ["--job.dry_run=true"], world)
        args = model_args(cfg.model.name, cfg.model.flavor, VOCAB, cfg.training.seq_len, cfg.moe)
        assert [r.numel for r in model_states.job_rank_states(cfg, world, args)] == real, (
            world,
            argv,
        )
