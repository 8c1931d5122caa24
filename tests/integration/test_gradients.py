"""Gradients of one step, tensor by tensor, in a parallel layout vs one rank (fp32)."""

import os
import subprocess
import sys

import fast_launch
import parity_cases
import pytest
import run_tests
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
COMMON = [
    "--model.name=deepseek_v3",
    "--model.flavor=tiny",
    "--training.seq_len=64",
    "--training.global_batch_size=4",
    "--training.mixed_precision_param=float32",
    "--training.deterministic=true",
    "--metrics.enable_tensorboard=false",
]


def dump_grads(tmp_path, name: str, ngpu: int, overrides: list[str]) -> dict:
    out = tmp_path / f"{name}.pt"
    args = [str(out), *COMMON, *overrides, f"--job.dump_folder={tmp_path / name}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": run_tests.ROOT}
    if run_tests.launcher_name() == "fast" and not fast_launch.needs_torchrun(env):
        logs = str(tmp_path / name / "ranks")
        rc, console = fast_launch.launch(
            ngpu, args, logs, env, run_tests.TIMEOUT_S, entry="grad_dump", with_config=False
        )
        assert rc == 0, console[-2000:] + run_tests.rank_tails(logs)
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={ngpu}",
            os.path.join(HERE, "grad_dump.py"),
            *args,
        ]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return torch.load(out)


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    return dump_grads(tmp_path_factory.mktemp("grads"), "one", 1, ["--training.local_batch_size=4"])


def _compare(got: dict, one_rank: dict) -> None:
    assert set(got) == set(one_rank)
    for key, ref in one_rank.items():
        rel = (got[key] - ref).abs().max().item() / max(ref.abs().max().item(), 1e-12)
        assert rel <= 1e-5, (key, rel)


@pytest.mark.parametrize(
    "name, ngpu, overrides",
    [
        # TP splits MLA's heads: the shared RoPE key's and the router's gradients are summed over TP.
        ("tp+ep", 2, [parity_cases.TP, parity_cases.EP, "--training.local_batch_size=4"]),
        # EP = all of dp_shard: the experts' FSDP group has size 1, their gradients must still be
        # divided by the 2 data-parallel ranks (exactly once).
        ("ep_all_of_dp_shard", 2, [parity_cases.EP, "--training.local_batch_size=2"]),
        # SimpleFSDP: experts' gradients reduced over what EP left of dp_shard, averaged over all dp.
        (
            "simple_fsdp+ep",
            2,
            [
                parity_cases.EP,
                "--training.local_batch_size=2",
                "--parallelism.fsdp_implementation=simple_fsdp",
            ],
        ),
    ],
)
def test_deepseek_gradients_match_one_rank(name, ngpu, overrides, one_rank, tmp_path):
    _compare(dump_grads(tmp_path, name, ngpu, overrides), one_rank)


@pytest.mark.slow
def test_deepseek_gradients_pp_fsdp_tp_ep_on_8_ranks(one_rank, tmp_path):
    overrides = [
        parity_cases.PP,
        parity_cases.TP,
        parity_cases.EP,
        "--training.local_batch_size=2",
        "--parallelism.pipeline_parallel_schedule=Interleaved1F1B",
    ]
    _compare(dump_grads(tmp_path, "pp+fsdp+tp+ep", 8, overrides), one_rank)
