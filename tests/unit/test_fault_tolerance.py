"""[fault_tolerance] without a lighthouse: each bad input's line (before launch), the global
batch over the replica groups and the rows each group reads, the groups' data positions, the
weights digest, and the averaging of gradients and loss sums over the groups."""

import contextlib
import importlib.util
import socket
from types import SimpleNamespace as NS

import pytest
import torch
from config_helpers import cfg_of, config_error

from torchtitan.checks.fault_tolerance import check_lighthouse
from torchtitan.config import ConfigError
from torchtitan.distributed.job_shape import batch_shape, replica_groups
from torchtitan.training import fault_tolerance as ft

FT = ["--fault_tolerance.enable", "--fault_tolerance.group_size=2"]
TINY = ["--model.flavor=tiny", "--training.device=cpu", "--training.local_batch_size=2"]


@pytest.mark.parametrize(
    "argv, expected",
    [
        (
            ["--fault_tolerance.replica_id=2"],
            "--fault_tolerance.replica_id=2: must be in 0..1 (--fault_tolerance.group_size=2"
            " replica groups)",
        ),
        (
            ["--fault_tolerance.min_replica_size=3"],
            "--fault_tolerance.min_replica_size=3: must be in 1..2 (the fewest of the"
            " --fault_tolerance.group_size=2 replica groups that train on)",
        ),
        (
            ["--parallelism.data_parallel_replicate_degree=2"],
            "--parallelism.data_parallel_replicate_degree=2 with --fault_tolerance.enable: the"
            " replica groups are the replicate dimension; set it to 1 and start"
            " --fault_tolerance.group_size groups",
        ),
        (
            ["--fault_tolerance.process_group=nccl"],
            "--fault_tolerance.process_group=nccl: the ranks train on CPU; use gloo between CPU"
            " groups",
        ),
        (
            ["--fault_tolerance.semi_sync_method=diloco", "--fault_tolerance.num_fragments=2",
             "--fault_tolerance.sync_steps=5"],
            "--fault_tolerance.sync_steps=5: must be a positive multiple of"
            " --fault_tolerance.num_fragments=2 (torchft syncs one fragment at a time)",
        ),
        (
            ["--fault_tolerance.semi_sync_method=local_sgd", "--fault_tolerance.num_fragments=2",
             "--fault_tolerance.sync_steps=4"],
            "--fault_tolerance.num_fragments=2: fragments are DiLoCo's; set"
            " --fault_tolerance.semi_sync_method=diloco, or 1 fragment",
        ),
        (
            ["--fault_tolerance.semi_sync_method=diloco", "--fault_tolerance.num_fragments=2",
             "--fault_tolerance.sync_steps=4", "--fault_tolerance.fragment_sync_delay=2"],
            "--fault_tolerance.fragment_sync_delay=2: must be in 0..1 (a fragment syncs every"
            " sync_steps / num_fragments = 2 steps)",
        ),
        (
            ["--fault_tolerance.semi_sync_method=diloco", "--fault_tolerance.fragment_update_alpha=2"],
            "--fault_tolerance.fragment_update_alpha=2.0: must be in 0..1",
        ),
        (
            ["--fault_tolerance.semi_sync_method=diloco", "--fault_tolerance.num_fragments=2",
             "--fault_tolerance.sync_steps=4",
             '--fault_tolerance.module_fqns_per_model_fragment=[["layers.0"]]'],
            "--fault_tolerance.module_fqns_per_model_fragment: 1 lists for"
            " --fault_tolerance.num_fragments=2; give one list per fragment",
        ),
        (
            ["--fault_tolerance.semi_sync_method=diloco", "--fault_tolerance.num_fragments=2",
             "--fault_tolerance.sync_steps=4", "--parallelism.pipeline_parallel_degree=2"],
            "--fault_tolerance.num_fragments=2 with --parallelism.pipeline_parallel_degree=2: a"
            " stage would hold no part of some fragment; use 1 fragment with pipeline parallel",
        ),
        (
            ["--fault_tolerance.semi_sync_method=diloco", "--fault_tolerance.outer_lr=0"],
            "--fault_tolerance.outer_lr=0.0: must be > 0",
        ),
        (
            ["--fault_tolerance.semi_sync_method=diloco", "--fault_tolerance.outer_momentum=1"],
            "--fault_tolerance.outer_momentum=1.0: must be in [0, 1)",
        ),
        (
            ["--fault_tolerance.semi_sync_method=diloco", "--fault_tolerance.outer_momentum=0"],
            "--fault_tolerance.outer_nesterov=true with --fault_tolerance.outer_momentum=0:"
            " Nesterov needs momentum; set outer_momentum > 0 or outer_nesterov=false",
        ),
        (
            ["--fault_tolerance.semi_sync_method=sgd"],
            "--fault_tolerance.semi_sync_method=sgd: use local_sgd or diloco, or leave it empty"
            " (every step synchronous)",
        ),
    ],
)  # fmt: skip
def test_bad_fault_tolerance_input_is_one_line(argv, expected):
    assert config_error([*TINY, *FT, *argv], 4) == expected


def test_without_torchft_or_a_lighthouse_the_launch_stops_in_one_line(monkeypatch):
    monkeypatch.delenv("TORCHFT_LIGHTHOUSE", raising=False)
    assert config_error([*TINY, *FT], 2) == (
        "--fault_tolerance.enable: TORCHFT_LIGHTHOUSE is not set; set it to the lighthouse's"
        " address (http://host:port; scripts/ft_local.py starts one and sets it)"
    )
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torchft" else real(name, *a)
    )
    assert config_error([*TINY, *FT], 2) == (
        "--fault_tolerance.enable: torchft is not installed; pip install -e '.[ft]' (torchft, an"
        " optional extra)"
    )


def test_an_unreachable_lighthouse_is_named_after_a_bounded_wait():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConfigError) as info:
        check_lighthouse({"TORCHFT_LIGHTHOUSE": f"http://127.0.0.1:{port}"}, wait_s=0.3)
    assert str(info.value) == (
        f"TORCHFT_LIGHTHOUSE=http://127.0.0.1:{port}: no lighthouse answers there (waited 0 s);"
        f" start it (torchft_lighthouse --bind [::]:{port} --min_replicas 1) or fix the address"
    )
    with socket.socket() as s:  # one that listens
        s.bind(("127.0.0.1", 0))
        s.listen()
        check_lighthouse({"TORCHFT_LIGHTHOUSE": f"127.0.0.1:{s.getsockname()[1]}"}, wait_s=0.3)


def test_the_global_batch_spans_every_replica_group():
    cfg = cfg_of([*TINY, *FT])
    assert replica_groups(cfg) == 2 and replica_groups(cfg_of(TINY)) == 1
    shape = batch_shape(cfg, 2)  # 2 groups x 2 data-parallel ranks x 2 rows
    assert (shape.global_batch, shape.accum_steps) == (8, 1)
    cfg = cfg_of([*TINY, *FT, "--training.global_batch_size=16"])
    assert batch_shape(cfg, 2).accum_steps == 2
    assert config_error([*TINY, *FT, "--training.global_batch_size=12"], 2).startswith(
        "--training.global_batch_size=12 must be a positive multiple of local_batch_size x"
        " data-parallel degree = 2 x 2 x 2 replica groups = 8"
    )


def test_data_positions_keep_the_latest_and_the_checkpoint_steps(tmp_path):
    pos = ft.DataPositions(str(tmp_path), replica_id=1, rank=0)
    assert pos.load(5) is None
    pos.save(4, {"slot": 4}, also_as_step=True)
    pos.save(5, {"slot": 5}, also_as_step=False)
    pos.wait()
    assert pos.load(4) == {"step": 4, "data": {"slot": 4}}  # a checkpoint step's own
    assert pos.load(7) == {"step": 5, "data": {"slot": 5}}  # else the latest
    assert sorted(p.name for p in (tmp_path / "ft" / "replica_1" / "rank_0").iterdir()) == [
        "latest.pkl",
        "step_4.pkl",
    ]


def test_the_weights_digest_tells_bitwise_equal_weights_apart():
    a, b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    b.load_state_dict(a.state_dict())
    assert ft.digest([a]) == ft.digest([b])
    with torch.no_grad():
        b.weight[0, 0] = torch.nextafter(b.weight[0, 0], torch.tensor(1.0))  # one ulp
    assert ft.digest([a]) != ft.digest([b])


def test_buckets_keep_one_dtype_and_the_order_and_put_large_tensors_alone():
    f32 = [torch.zeros(4) for _ in range(5)]  # 16 bytes each
    big = torch.zeros(16)  # 64 bytes: alone
    half = torch.zeros(4, dtype=torch.bfloat16)
    got = ft.buckets([f32[0], f32[1], half, big, f32[2], f32[3], f32[4]], cap=40)
    ids = [[id(t) for t in b] for b in got]
    assert ids == [
        [id(big)],  # at once
        [id(f32[0]), id(f32[1])],  # 32 bytes; a third would pass 40
        [id(f32[2]), id(f32[3])],
        [id(f32[4])],
        [id(half)],
    ]


def test_gradients_and_loss_sums_are_averaged_over_the_groups_in_one_all_reduce_per_dtype():
    """A stand-in manager with another group's values: the groups' mean lands in place."""
    other = {torch.float32: None, torch.bfloat16: None}
    calls = []

    class Manager:
        def allreduce(self, flat):
            calls.append(flat.dtype)
            peer = other[flat.dtype] = torch.ones_like(flat) * 3
            flat.add_(peer).div_(2)
            return NS(wait=lambda: None)

    groups = ft.ReplicaGroups.__new__(ft.ReplicaGroups)
    groups.manager, groups.semi = Manager(), ""
    groups.paused = lambda activity: contextlib.nullcontext()
    params = [torch.nn.Parameter(torch.zeros(2, 3)), torch.nn.Parameter(torch.zeros(4))]
    params[0].grad = torch.full((2, 3), 1.0)
    params[1].grad = torch.full((4,), 5.0, dtype=torch.float32)
    half = torch.nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))
    half.grad = torch.full((2,), 7.0, dtype=torch.bfloat16)
    frozen = torch.nn.Parameter(torch.zeros(1))  # no gradient: left out
    sums = NS(main=torch.tensor(9.0), aux=torch.tensor(1.0), mtp=torch.tensor(0.0))
    groups.average([*params, half, frozen], sums)
    assert calls == [torch.float32, torch.bfloat16]
    assert torch.equal(params[0].grad, torch.full((2, 3), 2.0))
    assert torch.equal(params[1].grad, torch.full((4,), 4.0))
    assert torch.equal(half.grad, torch.full((2,), 5.0, dtype=torch.bfloat16))
    assert (sums.main.item(), sums.aux.item(), sums.mtp.item()) == (6.0, 2.0, 1.5)
    assert frozen.grad is None
    # a gradient of BUCKET_BYTES or more is averaged in place, without a copy
    calls.clear()
    large = torch.nn.Parameter(torch.zeros(8))
    large.grad = torch.full((8,), 1.0)
    grad = large.grad
    ft.BUCKET_BYTES, keep = 16, ft.BUCKET_BYTES
    try:
        groups.average([large], sums)
    finally:
        ft.BUCKET_BYTES = keep
    assert large.grad is grad and torch.equal(grad, torch.full((8,), 2.0))


@pytest.mark.parametrize(
    "argv, expected",
    [
        (
            ["--kill", "1-20"],
            "argument --kill: '1-20': give G@S, a group and a step >= 1 (e.g. 1@20)",
        ),
        (["--kill", "2@5"], "--kill=2@5: there are groups 0..1"),
        (["--restart-at", "5"], "--restart-at: restarts the group --kill stops; give --kill too"),
        (["--", "--training.steps=0"], "--training.steps=0: must be >= 1"),
    ],
)
def test_ft_local_refuses_bad_input_in_one_line_before_starting_anything(
    argv, expected, tmp_path, monkeypatch, capsys
):
    import sys

    sys.path.insert(0, "scripts")
    import ft_local

    dump = tmp_path / "ft"
    monkeypatch.setattr(sys, "argv", ["ft_local.py", f"--dump={dump}", *argv])
    with pytest.raises(SystemExit) as info:
        ft_local.main()
    assert info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"ft_local.py: error: {expected}"
    assert not dump.exists()  # nothing written, no lighthouse, no group started
