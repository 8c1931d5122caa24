"""No host sync on a step that does not log: every read of a tensor's value by the host,
counted per rank and step (host_reads.py: a TorchDispatchMode for .item()/float()/bool(), a
TorchFunctionMode for .tolist()/.cpu()/.to("cpu")).

Steps 1-4 of 6 do not log (--metrics.log_freq=5): dense models read nothing there, in every
layout; MoE models with expert parallelism read exactly their all-to-all split sizes (one
.tolist() per MoE layer per micro-batch: NCCL and gloo take split sizes from the host). The
steps that log (5 and 6) read their figures. Pipeline parallel reads at step 1 only: the
schedule's shape inference (torch's pipelining, once).

    python tests/integration/test_host_reads.py   # the table of every layout (slow ones too)
"""

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fast_launch  # noqa: E402
import run_tests  # noqa: E402

LOG_FREQ, STEPS = 5, 6
COMMON = [
    "--model.flavor=tiny",
    f"--training.steps={STEPS}",
    f"--metrics.log_freq={LOG_FREQ}",
    "--training.seq_len=64",
    "--training.local_batch_size=2",
    "--training.global_batch_size=8",
    "--training.mixed_precision_param=float32",
    "--metrics.enable_tensorboard=false",
    "--planning.memory_budget_gib=none",
    "--checkpoint.enable=false",
]
LLAMA, DS = "train_configs/llama3_debug.toml", "train_configs/deepseek_v3_debug.toml"
QWEN, QWEN_MOE = "train_configs/qwen3_debug.toml", "train_configs/qwen3_moe_debug.toml"
EP, TP, PP = (
    "--parallelism.expert_parallel_degree=2",
    "--parallelism.tensor_parallel_degree=2",
    "--parallelism.pipeline_parallel_degree=2",
)

# name: (ranks, config, overrides, EP split-size reads per non-logging step on rank 0, slow)
# MoE layers: DeepSeek-V3 tiny 3 of 4 (the first is dense), Qwen3 tiny_moe 3 of 4. Micro-
# batches per step on a rank: global 8 / (local 2 x data-parallel ranks), x2 under PP.
CASES = {
    "llama_fsdp2": (2, LLAMA, [], 0, False),
    "llama_simple_fsdp": (2, LLAMA, ["--parallelism.fsdp_implementation=simple_fsdp"], 0, True),
    "llama_tp": (4, LLAMA, [TP], 0, True),
    "llama_pp": (4, LLAMA, [PP], 0, True),
    "llama_cp": (2, LLAMA, ["--parallelism.context_parallel_degree=2"], 0, True),
    "deepseek_ep": (2, DS, [EP], 3 * 2, False),
    "deepseek_tp_ep": (4, DS, [TP, EP], 3 * 2, True),
    "deepseek_pp_ep": (
        4,
        DS,
        [PP, EP],
        None,
        True,
    ),  # rank 0 holds the first stage: checked per stage below
    "deepseek_mtp": (
        2,
        DS,
        [EP, "--model.mtp_depth=1"],
        4 * 2,
        True,
    ),  # the MTP block is a MoE block too
    "qwen3_dense": (2, QWEN, [], 0, True),
    "qwen3_moe_ep": (2, QWEN_MOE, [EP, "--model.flavor=tiny_moe"], 3 * 2, True),
}


def count_reads(tmp_path, name: str) -> dict:
    ngpu, config, overrides, _, _ = CASES[name]
    out = tmp_path / f"{name}.json"
    args = [
        str(out),
        f"--job.config_file={config}",
        *COMMON,
        *overrides,
        f"--job.dump_folder={tmp_path / name}",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": run_tests.ROOT}
    if run_tests.launcher_name() == "fast" and not fast_launch.needs_torchrun(env):
        logs = str(tmp_path / name / "ranks")
        rc, console = fast_launch.launch(
            ngpu, args, logs, env, run_tests.TIMEOUT_S, entry="host_reads", with_config=False
        )
        assert rc == 0, console[-2000:] + run_tests.rank_tails(logs)
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={ngpu}",
            os.path.join(HERE, "host_reads.py"),
            *args,
        ]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=run_tests.ROOT)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return {
        int(rank): {int(step): reads for step, reads in steps.items()}
        for rank, steps in json.loads(out.read_text())["reads"].items()
    }


def per_step(reads: dict, step: int) -> int:
    return sum(reads.get(step, {}).values())


def split_size_reads(reads: dict, step: int) -> int:
    return sum(n for what, n in reads.get(step, {}).items() if "expert_parallel.py" in what)


def check(name: str, by_rank: dict) -> None:
    ngpu, _, overrides, ep_reads, _ = CASES[name]
    first_quiet_step = 2 if PP in overrides else 1  # pipelining's one-time shape inference
    for rank, reads in by_rank.items():
        expected = ep_reads
        if (
            expected is None
        ):  # PP + EP: the first stage has 1 MoE layer (of 4 layers, 1 dense), the last 2
            expected = (1 if rank < ngpu // 2 else 2) * 2 * 2
        for step in range(first_quiet_step, LOG_FREQ):
            assert per_step(reads, step) == expected, (rank, step, reads.get(step))
            assert split_size_reads(reads, step) == expected, (rank, step, reads.get(step))
        # the logging steps read their figures (and nothing reads more than that)
        assert per_step(reads, LOG_FREQ) > expected, (rank, reads.get(LOG_FREQ))


@pytest.mark.parametrize(
    "name",
    [n for n, c in CASES.items() if not c[4]]
    + [pytest.param(n, marks=pytest.mark.slow) for n, c in CASES.items() if c[4]],
)
def test_no_host_read_on_steps_that_do_not_log(tmp_path, name):
    check(name, count_reads(tmp_path, name))


if __name__ == "__main__":  # the closing note's table
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        from pathlib import Path

        for case in CASES:
            by_rank = count_reads(Path(tmp), case)
            last = max(by_rank)  # under PP the last stage's rank reads other figures than rank 0
            for rank in (0, last) if PP in CASES[case][2] else (0,):
                quiet = [per_step(by_rank[rank], s) for s in range(1, LOG_FREQ)]
                split = [split_size_reads(by_rank[rank], s) for s in range(1, LOG_FREQ)]
                print(
                    f"{case:16s} rank {rank}, reads at steps 1-{LOG_FREQ - 1}: {quiet} (EP split sizes {split}),"
                    f" at step {LOG_FREQ} (logs): {per_step(by_rank[rank], LOG_FREQ)}",
                    flush=True,
                )
