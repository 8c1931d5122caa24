"""Llama3's plan.json is what it was before the distributed core became model-agnostic
(units with blocks and meshes, one shared data-parallel function, EP in the mesh).

The golden files in tests/golden were written by the dry run of commit 830210d (before the
restructuring) with the commands below; any change of a plan, reason, size, AC region or
memory estimate shows up here.
"""

import json
import os

import pytest
import run_tests

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CASES = {
    "debug_fsdp": (8, "llama3_debug.toml", ["--model.flavor=tiny"]),
    "debug_pp_tp": (8, "llama3_debug.toml", [
        "--parallelism.pipeline_parallel_degree=2", "--parallelism.tensor_parallel_degree=2",
        "--parallelism.pipeline_parallel_schedule=Interleaved1F1B", "--training.local_batch_size=4",
        "--parallelism.fsdp_implementation=simple_fsdp", "--activation_checkpoint.mode=selective"]),
    "8b_budget": (64, "llama3_8b.toml", [
        "--parallelism.tensor_parallel_degree=8", "--parallelism.reshard_budget_gib=1",
        "--parallelism.data_parallel_replicate_degree=2"]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_llama3_plan_json_is_unchanged(name, tmp_path):
    ngpu, config, overrides = CASES[name]
    # (run_train.sh's dry-run launch itself: test_reshard_counts.py's 405B dry run)
    rc, _, out = run_tests.launch(ngpu, ["--job.dry_run=true", f"--job.dump_folder={tmp_path}", *overrides],
                                  str(tmp_path / "ranks"),
                                  extra_env={"CONFIG_FILE": os.path.join(ROOT, "train_configs", config)})
    assert rc == 0, out[-4000:]
    with open(tmp_path / "plan.json") as f:
        got = json.load(f)
    with open(os.path.join(ROOT, "tests", "golden", f"llama3_plan_{name}.json")) as f:
        assert got == json.load(f)
