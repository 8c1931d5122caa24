"""FSDP2's CPU offload and the optimizer stepped in backward, in real 2-rank runs against the
plain run of the same job (clipping off: the early step refuses it): the same losses bitwise
(AdamW is elementwise, one parameter's update does not depend on how many share a kernel
call), the gradient norm the hooks measured equal to the clip's (rel 1e-5); and the per-parameter
optimizers' DCP state resumes bitwise and loads into a plain run (the same keys).
Parity with one rank: feature_cases.py (fsdp+cpu_offload, fsdp+opt_in_bwd,
cpu_offload+opt_in_bwd+tp+cp and its dp_replicate variant)."""

import os
import shutil

import checkpoint_checks as cc
import pytest
import run_tests

JOB = ["--training.local_batch_size=4", "--training.max_norm=0"]  # global batch 8 on 2 ranks
OFFLOAD = "--training.enable_cpu_offload=true"
EARLY = "--optimizer.early_step_in_backward=true"
CKPT = ["--checkpoint.enable=true", "--checkpoint.interval=5"]


def _run(extra, dump) -> tuple[list[float], list[float]]:
    rc, _, log = run_tests.run(2, [*JOB, *extra], str(dump))
    assert rc == 0, log[-3000:]
    return run_tests.read_losses(str(dump)), run_tests.read_grad_norms(str(dump))


def test_offload_and_early_step_equal_the_plain_run(tmp_path):
    plain_loss, plain_norm = _run([], tmp_path / "plain")
    loss, norm = _run([OFFLOAD, EARLY], tmp_path / "offload_early")
    assert len(loss) == 10 and loss == plain_loss
    assert (
        run_tests.max_rel_diff(norm, plain_norm) < 1e-5
    )  # measured 4.2e-6: fp32 sums in another order


def test_early_step_checkpoint_resumes_and_loads_into_a_plain_run(tmp_path):
    dump = tmp_path / "early"
    _run([EARLY, *CKPT], dump)
    straight = cc.losses(str(dump))
    shutil.rmtree(dump / "checkpoint" / "step-10")
    os.remove(dump / "metrics.jsonl")
    _run([EARLY, *CKPT], dump)
    resumed = cc.losses(str(dump))
    assert sorted(resumed) == list(range(6, 11))
    assert [resumed[s] for s in range(6, 11)] == [straight[s] for s in range(6, 11)]
    plain = tmp_path / "plain"
    (plain / "checkpoint").mkdir(parents=True)
    shutil.copytree(dump / "checkpoint" / "step-5", plain / "checkpoint" / "step-5")
    _run(CKPT, plain)  # one AdamW per part reads the per-parameter optimizers' state
    assert [cc.losses(str(plain))[s] for s in range(6, 11)] == [straight[s] for s in range(6, 11)]


@pytest.mark.parametrize("extra", [[EARLY], [OFFLOAD]])
def test_refused_combinations_stop_before_launch(extra, tmp_path):
    # early step under pipeline parallel (as upstream refuses it); offload under SimpleFSDP
    argv = (
        [EARLY, "--parallelism.pipeline_parallel_degree=2"]
        if extra == [EARLY]
        else [OFFLOAD, "--parallelism.fsdp_implementation=simple_fsdp"]
    )
    rc, _, log = run_tests.run(2, argv, str(tmp_path / "bad"))
    assert rc == 2, log[-2000:]
    want = (
        "steps each parameter inside backward: not with --parallelism.pipeline_parallel_degree=2"
        if extra == [EARLY]
        else "--parallelism.fsdp_implementation=simple_fsdp has none"
    )
    assert want in log


def _predicted(extra, dump) -> dict:
    """The dry run's plan.json memory entry of the one role (a GPU job: training.device auto,
    so the job is planned for CUDA on this CPU machine)."""
    import json

    argv = [
        "--job.dry_run=true",
        "--training.seq_len=32",
        "--training.local_batch_size=1",
        "--training.max_norm=0",
        "--planning.nearby=false",
        f"--job.dump_folder={dump}",
        *extra,
    ]
    rc, _, log = run_tests.launch(2, argv, str(dump / "ranks"))
    assert rc == 0, log[-3000:]
    with open(os.path.join(dump, "plan.json")) as f:
        (role,) = json.load(f)["memory_per_rank_role"]
    return role


def test_the_prediction_takes_offload_and_the_early_step_into_account(tmp_path):
    plain = _predicted([], tmp_path / "plain")
    offload = _predicted([OFFLOAD], tmp_path / "offload")
    early = _predicted([EARLY], tmp_path / "early")
    b = plain["breakdown"]
    assert plain["peak_at"] == "optimizer" and b["gradients"] > 0  # the plain peak: the update
    # offload: the sharded states live on the host; the device holds the step's own bytes
    host = sum(b[k] for k in ("parameters", "gradients", "optimizer_states"))
    host += b["optimizer_transients"]
    assert offload["predicted_peak_bytes"] == plain["predicted_peak_bytes"] - host
    assert offload["breakdown"]["parameters"] == offload["breakdown"]["optimizer_states"] == 0
    # early step: each gradient is freed by its hook, none is alive at the (backward) peak
    assert early["breakdown"]["gradients"] == early["breakdown"]["optimizer_transients"] == 0
    assert early["predicted_peak_bytes"] < plain["predicted_peak_bytes"]
