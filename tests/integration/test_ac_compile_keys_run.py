"""Short compiled runs of upstream's activation-checkpoint and compile keys (2 ranks, tiny
Llama3, 3 steps, fp32, aot_eager: AOTAutograd's min-cut partitioner, which the memory budget
steers, without inductor's codegen time):

- mode=memory_budget trains, its losses equal the compiled run without AC within fp32
  tolerance, and the partitioner took the budget: with visualize_memory_budget_pareto each
  rank wrote its trade-off curves into <dump_folder>/memory_budget_pareto;
- compile.graph_passes=transformer_block_bucketing (SimpleFSDP): the same losses, bitwise,
  and one all-gather per FSDP unit and forward pass, no more than without the key (the layout
  SimpleFSDP runs: each unit's parameters in one bucket)."""

import json
import os

import pytest
import run_tests

COMPILED = ["--training.steps=3", "--compile.enable=true", "--compile.backend=aot_eager"]
SIMPLE = "--parallelism.fsdp_implementation=simple_fsdp"
TINY_UNITS = 6  # the tiny Llama3's FSDP units: embeddings, 4 blocks, root (norm + output)
ACCUM = 2  # forward passes per step: global batch 8 = 2 ranks x local batch 2 x 2


def _run(tmp_path_factory, name: str, overrides: list[str]) -> tuple[str, list[float], list]:
    dump = str(tmp_path_factory.mktemp(name))
    rc, _, log = run_tests.run(2, [*COMPILED, "--metrics.comm_stats=true", *overrides], dump)
    assert rc == 0, log[-3000:]
    with open(os.path.join(dump, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if line.strip() and "loss" in line]
    return dump, run_tests.read_losses(dump), [r for r in records if "loss" in r]


# slow: two compiled runs; `make test` checks the mode's build (no AC region, the partitioner's
# budget set: test_ac_upstream_keys.py)
@pytest.mark.slow
def test_memory_budget_mode_trains_like_no_ac(tmp_path_factory):
    _, reference, _ = _run(tmp_path_factory, "no_ac", [])
    dump, losses, _ = _run(
        tmp_path_factory,
        "memory_budget",
        [
            "--activation_checkpoint.mode=memory_budget",
            "--activation_checkpoint.memory_budget=0.3",
            "--activation_checkpoint.visualize_memory_budget_pareto=true",
        ],
    )
    assert len(losses) == len(reference) == 3
    assert losses == pytest.approx(reference, abs=1e-5, rel=0)
    curves = sorted(os.listdir(os.path.join(dump, "memory_budget_pareto")))
    for rank in (0, 1):  # one SVG per compiled graph and rank
        mine = [c for c in curves if c.startswith(f"memory_budget_pareto_rank_{rank}_")]
        assert mine and all(c.endswith(".svg") for c in mine), curves


# slow: the key changes nothing SimpleFSDP runs (one gather per unit: test_simple_fsdp_ac.py in
# `make test`); `make test` checks it is accepted (test_ac_upstream_keys.py::test_accepted)
@pytest.mark.slow
def test_transformer_block_bucketing_is_one_gather_per_unit(tmp_path_factory):
    _, reference, plain = _run(tmp_path_factory, "simple", [SIMPLE])
    _, losses, bucketed = _run(
        tmp_path_factory, "bucketed", [SIMPLE, "--compile.graph_passes=transformer_block_bucketing"]
    )
    assert losses == reference  # bitwise: the same graphs
    for records in (plain, bucketed):
        gathers = {r["comm"]["forward/all_gather/dp_shard"] for r in records}
        assert gathers == {TINY_UNITS * ACCUM}, gathers
