"""Context parallel's rotate methods in real runs, counted: allgather gathers K and V once per
layer (their gradients reduce-scattered in backward); alltoall gathers nothing and sends the
K/V of each layer CP - 1 hops round the ring, forward and backward (the autograd all-to-all
sends the gradients back). Losses equal the allgather run's. Parity with one rank:
feature_cases.py (cp_allgather, cp_alltoall, fsdp+tp+cp)."""

import json

import parity_cases
import pytest
import run_tests

LAYERS = 4  # both tiny flavors
TINY = [
    "--model.flavor=tiny",
    "--training.steps=2",
    "--training.seq_len=64",
    "--training.local_batch_size=4",
    "--metrics.comm_stats=true",
    "--training.mixed_precision_param=float32",
    "--training.deterministic=true",
    "--metrics.enable_tensorboard=false",
    "--planning.memory_budget_gib=none",
    parity_cases.CP2,
]
A2A = "--parallelism.context_parallel_rotate_method=alltoall"


def _records(dump) -> list[dict]:
    return [json.loads(line) for line in (dump / "metrics.jsonl").read_text().splitlines()]


def _run(args, dump, model="llama3") -> list[dict]:
    rc, _, out = run_tests.launch(
        2, [f"--model.name={model}", *TINY, *args, f"--job.dump_folder={dump}"], str(dump / "ranks")
    )
    assert rc == 0, out[-3000:]
    return _records(dump)


def _cp(record: dict) -> dict[str, int]:
    return {k: v for k, v in record["comm"].items() if k.endswith("/cp")}


@pytest.mark.parametrize("model", ["llama3", "deepseek_v3"])
def test_cp2_alltoall_vs_allgather_collectives_and_losses(model, tmp_path):
    extra = ["--job.config_file=train_configs/deepseek_v3_debug.toml"] if model != "llama3" else []
    gathered = _run(extra, tmp_path / "ag", model)
    ring = _run([*extra, A2A], tmp_path / "a2a", model)
    per_layer = 2 if model == "llama3" else 1  # K and V, or MLA's latent + RoPE key
    assert _cp(gathered[-1]) == {
        "forward/all_gather/cp": per_layer * LAYERS,
        "backward/reduce_scatter/cp": per_layer * LAYERS,
    }
    # CP 2: one hop per layer forward (K and V as one tensor), one back in backward
    assert _cp(ring[-1]) == {"forward/all_to_all/cp": LAYERS, "backward/all_to_all/cp": LAYERS}
    for a, b in zip(gathered, ring):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=0)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5, abs=0)
