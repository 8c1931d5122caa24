"""The step-time prediction in a training run: with a hardware profile and no memory budget
the start-up prediction still runs, writes step_time_per_rank_role to plan.json, and the run
logs predicted vs measured step time once, after the first sync point plus four steps. (The
model's parts: tests/unit/test_step_time.py; its error: scripts/step_time_check.py.)"""

import dataclasses
import json
import re

import run_tests

TINY = [
    "--model.flavor=tiny",
    "--training.seq_len=64",
    "--training.local_batch_size=2",
    "--training.steps=6",
    "--training.device=cpu",
    "--training.mixed_precision_param=float32",
    "--metrics.enable_tensorboard=false",
    "--planning.memory_budget_gib=none",
]


def _local_profile(path) -> None:
    """A cached `local` profile for this machine (made up: the test checks the plumbing)."""
    from torchtitan.hardware import PROFILES
    from torchtitan.planning.step_time.local_profile import machine_key

    profile = dataclasses.replace(PROFILES["a100_80gb"], name="local", host_async=False, cores=2)
    path.write_text(json.dumps({"key": machine_key(), "profile": dataclasses.asdict(profile)}))


def test_a_run_logs_its_predicted_and_measured_step_time(tmp_path):
    cache = tmp_path / "profile.json"
    _local_profile(cache)
    rc, _, out = run_tests.launch(
        2,
        [*TINY, f"--job.dump_folder={tmp_path}"],
        str(tmp_path / "ranks"),
        extra_env={"TITAN_PROFILE_CACHE": str(cache)},
    )
    assert rc == 0, out[-3000:]
    lines = [ln for ln in out.splitlines() if ln.startswith("[torchtitan] step time, rank 0")]
    assert len(lines) == 1, out[-3000:]  # once
    m = re.fullmatch(
        r"\[torchtitan\] step time, rank 0 \(role all, hardware local\): predicted (\d+\.\d{3})s,"
        r" measured (\d+\.\d{3})s \(mean of the steps up to 5 after the first sync point\),"
        r" error [+-]\d+\.\d%",
        lines[0],
    )
    assert m, lines[0]
    assert out.index(lines[0]) < out.index(
        "step 5/6"
    )  # logged at step 5's sync point, before its line
    plan = json.loads((tmp_path / "plan.json").read_text())
    (role,) = plan["step_time_per_rank_role"]
    assert role["ranks"] == [0, 1] and role["role"] == "all"
    assert f"{role['predicted_step_seconds']:.3f}" == m[1]
    assert set(role["breakdown"]) <= {
        "compute",
        "recompute",
        "overhead",
        "optimizer",
        "comm_dp_shard",
    }
    assert abs(sum(role["breakdown"].values()) - role["predicted_step_seconds"]) < 1e-9


def test_without_a_profile_or_a_budget_nothing_is_predicted(tmp_path):
    rc, _, out = run_tests.launch(
        1,
        [*TINY, "--training.steps=2", f"--job.dump_folder={tmp_path}"],
        str(tmp_path / "ranks"),
        extra_env={"TITAN_PROFILE_CACHE": "none"},
    )
    assert rc == 0, out[-3000:]
    assert "step time, rank" not in out
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["step_time_per_rank_role"] is None and plan["memory_per_rank_role"] is None
