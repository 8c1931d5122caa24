"""run_train.sh across nodes: two launches on this machine, as two "nodes" (c10d rendezvous on
localhost), train the same losses as one launch of all their ranks: 2 x 1 rank in `make test`,
2 x 2 ranks with --slow."""

import json
import os
import socket
import subprocess

import parity_cases
import pytest
import run_tests


def _args(world: int) -> list[str]:
    return [
        *parity_cases.BASE,
        "--training.steps=3",
        f"--parallelism.data_parallel_shard_degree={world}",
    ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _losses(dump) -> list[float]:
    return [json.loads(line)["loss"] for line in (dump / "metrics.jsonl").read_text().splitlines()]


# `make test`: 2 nodes of 1 rank against one 2-rank launch (the fast launcher's, which gives a
# run run_train.sh's argv and environment); --slow: 2 nodes of 2 ranks against run_train.sh on 4
@pytest.mark.parametrize("per_node", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_two_nodes_train_like_one(tmp_path, per_node):
    port, world = _free_port(), 2 * per_node
    nodes = []
    for node in (0, 1):  # each its own dump folder: whichever node gets global rank 0 writes
        env = {
            **os.environ,
            "NGPU": str(per_node),
            "NNODES": "2",
            "NODE_RANK": str(node),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RDZV_ID": f"test{port}",
        }
        nodes.append(
            subprocess.Popen(
                [
                    run_tests.RUN_TRAIN,
                    *_args(world),
                    f"--job.dump_folder={tmp_path / f'node{node}'}",
                ],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = [p.communicate(timeout=600)[0] for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], "\n".join(o[-2000:] for o in outputs)
    written = [
        tmp_path / f"node{n}" for n in (0, 1) if (tmp_path / f"node{n}" / "metrics.jsonl").exists()
    ]
    assert len(written) == 1
    one = tmp_path / "one"
    if per_node == 1:
        rc, _, out = run_tests.launch(
            world, [*_args(world), f"--job.dump_folder={one}"], str(one / "ranks")
        )
        assert rc == 0, out[-2000:]
    else:
        proc = subprocess.run(
            [run_tests.RUN_TRAIN, *_args(world), f"--job.dump_folder={one}"],
            env={**os.environ, "NGPU": str(world)},
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
    two, one = _losses(written[0]), _losses(one)
    assert len(two) == 3 and run_tests.max_rel_diff(two, one) <= 1e-6, (two, one)


@pytest.mark.parametrize(
    "env, first_words",
    [
        ({}, "error: NNODES=2 needs the rendezvous host"),
        (
            {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "70000"},
            "error: rendezvous endpoint '127.0.0.1:70000'",
        ),
        ({"RDZV_ENDPOINT": "hostonly"}, "error: rendezvous endpoint 'hostonly'"),
        (
            {"MASTER_ADDR": "127.0.0.1", "NODE_RANK": "2"},
            "error: NODE_RANK=2: must be an integer in 0..1",
        ),
        ({"NNODES": "two"}, "error: NNODES=two: must be a positive integer"),
    ],
)
def test_bad_multinode_settings_are_refused(tmp_path, env, first_words):
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MASTER_ADDR", "MASTER_PORT", "RDZV_ENDPOINT", "NODE_RANK")
    }
    proc = subprocess.run(
        [run_tests.RUN_TRAIN, f"--job.dump_folder={tmp_path / 'x'}"],
        env={**base, "NGPU": "2", "NNODES": "2", **env},
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and proc.stderr.startswith(first_words), proc.stderr
    assert proc.stderr.count("\n") == 1 and not (tmp_path / "x").exists()
