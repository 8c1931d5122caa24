"""The start-up plan report (plan_table, compress_table, write_plan_json) and CommStats:
its helpers, phases and reset without a process group, then real collectives on a 1-rank
gloo group in this process."""

import json
import os

import pytest
import torch
import torch.distributed as dist

from torchtitan.distributed.parallel_dims import mesh_group_dims
from torchtitan.observe import comm_stats
from torchtitan.observe.comm_stats import CommStats, _tensor_bytes, group_name_of
from torchtitan.training.plan_report import compress_table, plan_table, write_plan_json
from torchtitan.units import MIB

# --------------------------------------------------------------------------- plan_table


def unit(name, reshard, reason, param_bytes):
    return {
        "name": name,
        "reshard_after_forward": reshard,
        "reason": reason,
        "param_bytes": param_bytes,
    }


RECORDS = [  # deliberately out of stage order
    {
        "stage": 1,
        "fsdp_units": [
            unit("layers.1", False, "auto: last", 3 * MIB // 2),
            unit("<root>", False, "root", 1536 * MIB),
        ],
    },
    {"stage": 0, "fsdp_units": [unit("tok_embeddings", True, "auto: freed", 100)]},
]


def test_plan_table_exact_text():
    assert MIB == 1024 * 1024
    # column widths: 8 ("PP stage"), 14 ("tok_embeddings"), 13 ("unsharded MiB"), 7 ("reshard"),
    # 9 ("AC region"; "-" when the part has no ac_regions)
    assert plan_table(RECORDS).splitlines() == [
        "PP stage  FSDP unit       unsharded MiB  reshard  AC region  reason",
        "-" * 67,
        "0         tok_embeddings            0.0  yes      -          auto: freed",
        "1         layers.1                  1.5  no       -          auto: last",
        "1         <root>                1,536.0  no       -          root",
    ]


def test_plan_table_shows_the_ac_region_of_a_unit():
    records = [
        {
            "stage": 0,
            "fsdp_units": [unit("layers.0", True, "r", MIB), unit("<root>", False, "root", MIB)],
            "ac_regions": [
                {
                    "name": "layers.0",
                    "mode": "op",
                    "fsdp_ac_policy": "recompute",
                    "label": "op SAC, FSDP gathers recomputed",
                }
            ],
        }
    ]
    lines = plan_table(records).splitlines()
    assert "op SAC, FSDP gathers recomputed" in lines[2]
    assert lines[3].split()[4] == "-"


def test_plan_table_sorts_stages_numerically_and_keeps_unit_order():
    records = [
        {
            "stage": 10,
            "fsdp_units": [unit("layers.20", True, "a", MIB), unit("layers.21", True, "b", MIB)],
        },
        {
            "stage": 2,
            "fsdp_units": [unit("layers.9", False, "c", 2 * MIB), unit("layers.4", True, "d", MIB)],
        },
    ]
    lines = plan_table(records).splitlines()
    assert [line.split()[:2] for line in lines[2:]] == [
        ["2", "layers.9"],
        ["2", "layers.4"],
        ["10", "layers.20"],
        ["10", "layers.21"],
    ]
    assert [line.split()[3] for line in lines[2:]] == ["no", "yes", "yes", "yes"]
    assert [line.split()[2] for line in lines[2:]] == ["2.0", "1.0", "1.0", "1.0"]


def test_plan_table_mib_has_one_decimal_and_thousands_separators():
    records = [
        {
            "stage": 0,
            "fsdp_units": [
                unit("a", True, "r", 0),
                unit("b", True, "r", 5 * MIB // 4),
                unit("c", True, "r", 2_000_000 * MIB),
                unit("d", True, "r", 1023 * MIB + 3 * MIB // 4),
            ],
        }
    ]
    values = [line.split()[2] for line in plan_table(records).splitlines()[2:]]
    assert values == ["0.0", "1.2", "2,000,000.0", "1,023.8"]


def test_plan_table_with_no_units_is_just_the_header():
    assert (
        plan_table([])
        == "PP stage  FSDP unit  unsharded MiB  reshard  AC region  reason\n" + "-" * 62
    )


# --------------------------------------------------------------------------- compress_table


def test_compress_table_keeps_short_tables():
    table = "\n".join(f"row {i}" for i in range(6))
    assert compress_table(table, head=3, tail=2) == table  # 6 <= 3 + 2 + 1
    assert compress_table("only line") == "only line"


def test_compress_table_keeps_head_and_tail():
    table = "\n".join(f"row {i}" for i in range(7))
    assert compress_table(table, head=3, tail=2) == "\n".join(
        ["row 0", "row 1", "row 2", "... 2 more rows in plan.json ...", "row 5", "row 6"]
    )


def test_compress_table_of_a_long_plan_with_the_defaults():
    records = [
        {"stage": 0, "fsdp_units": [unit(f"layers.{i}", True, f"r{i}", MIB) for i in range(20)]}
    ]
    table = plan_table(records)
    assert len(table.splitlines()) == 22
    lines = compress_table(table).splitlines()
    assert len(lines) == 12 + 1 + 4
    assert lines[:12] == table.splitlines()[:12]
    assert lines[12] == "... 6 more rows in plan.json ..."
    assert [line.split()[1] for line in lines[13:]] == [
        "layers.16",
        "layers.17",
        "layers.18",
        "layers.19",
    ]
    # 17 lines (header + rule + 15 units) are at the limit and kept whole
    short = plan_table([{"stage": 0, "fsdp_units": records[0]["fsdp_units"][:15]}])
    assert compress_table(short) == short


# --------------------------------------------------------------------------- write_plan_json


def test_write_plan_json(tmp_path):
    folder = tmp_path / "dump" / "nested"
    path = write_plan_json(
        str(folder),
        8,
        {"pp": 2, "dp_shard": 4},
        RECORDS,
        {"reshard_after_forward": "auto", "memory_budget_gib": 1.5},
    )
    assert path == os.path.join(str(folder), "plan.json")
    with open(path) as f:
        data = json.load(f)
    assert list(data) == [
        "world_size",
        "mesh",
        "reshard_after_forward",
        "memory_budget_gib",
        "model_parts",
    ]
    assert data == {
        "world_size": 8,
        "mesh": {"pp": 2, "dp_shard": 4},
        "reshard_after_forward": "auto",
        "memory_budget_gib": 1.5,
        "model_parts": [RECORDS[1], RECORDS[0]],
    }
    assert RECORDS[0]["stage"] == 1  # the caller's list is not reordered


def test_write_plan_json_overwrites_an_existing_plan(tmp_path):
    write_plan_json(str(tmp_path), 2, {"dp_shard": 2}, RECORDS, {"dry_run": True})
    path = write_plan_json(str(tmp_path), 1, {"dp_shard": 1}, [], {})
    with open(path) as f:
        assert json.load(f) == {"world_size": 1, "mesh": {"dp_shard": 1}, "model_parts": []}
    assert sorted(os.listdir(tmp_path)) == ["plan.json"]


# --------------------------------------------------------------------------- helpers


def test_tensor_bytes():
    assert _tensor_bytes(torch.zeros(3, 4)) == 48
    assert _tensor_bytes(torch.zeros(10, dtype=torch.bfloat16)) == 20
    assert _tensor_bytes(torch.zeros(5, dtype=torch.int64)) == 40
    assert _tensor_bytes(torch.zeros(0)) == 0
    assert (
        _tensor_bytes([torch.zeros(2), (torch.zeros(3), [torch.zeros(1, dtype=torch.float16)])])
        == 8 + 12 + 2
    )
    assert _tensor_bytes([]) == 0
    for other in (None, 7, "sum", 1.5):
        assert _tensor_bytes(other) == 0


def test_tensor_bytes_of_meta_tensors_needs_no_storage():
    assert _tensor_bytes(torch.empty(1024, 1024, device="meta")) == 4 * 2**20


def test_group_name_of_functional_op_arguments():
    t = torch.zeros(2)
    known = {"7": "tp", "3": "dp_shard"}
    assert group_name_of((t, "sum", 2, "7"), known) == "7"  # all_reduce: reduce op before the group
    assert group_name_of((t, "avg", 4, "3"), known) == "3"  # reduce_scatter_tensor
    assert group_name_of((t, 4, "3"), known) == "3"  # all_gather_into_tensor
    # a known name wins over a later unknown string
    assert group_name_of((t, "3", "nine"), known) == "3"
    # unknown: the last string
    assert group_name_of((t, "sum", 2, "11"), known) == "11"
    assert group_name_of((t, "sum", 2, "11"), {}) == "11"
    # no string at all
    assert group_name_of((t, 2, 3), known) is None
    assert group_name_of((), known) is None


def test_module_constants():
    assert comm_stats._NAMESPACES == (
        "c10d",
        "_c10d_functional",
        "_c10d_functional_autograd",
        "torchtitan",
    )
    assert comm_stats._KINDS["simple_fsdp_gather"] == "all_gather"
    assert comm_stats._KINDS["_allgather_base_"] == "all_gather"
    assert comm_stats._KINDS["_reduce_scatter_base_"] == "reduce_scatter"
    assert comm_stats._KINDS["allreduce_"] == "all_reduce"
    assert comm_stats._KINDS["all_to_all_single"] == "all_to_all"
    assert set(comm_stats._KINDS.values()) == {
        "all_gather",
        "reduce_scatter",
        "all_reduce",
        "all_to_all",
        "broadcast",
        "send",
        "recv",
    }
    assert CommStats.ignore_compile_internals() is True


# --------------------------------------------------------------------------- recording without a group

FUNC = torch.ops._c10d_functional
C10D = torch.ops.c10d


def test_record_keys_and_bytes_of_functional_ops():
    cs = CommStats({"g1": "tp", "g2": "dp_shard"})
    t = torch.zeros(4, 8)  # 128 bytes
    cs._record("all_reduce", FUNC.all_reduce.default, (t, "sum", "g1"))
    cs._record("all_reduce", FUNC.all_reduce.default, (t, "sum", "g1"))
    cs._record(
        "all_gather", FUNC.all_gather_into_tensor.default, (t, 4, "g2")
    )  # output = 4 x input
    cs._record("reduce_scatter", FUNC.reduce_scatter_tensor.default, (t, "avg", 4, "g2"))  # input
    cs._record("all_gather", FUNC.all_gather_into_tensor_coalesced.default, ([t, t[:1]], 2, "g2"))
    cs._record("all_reduce", FUNC.all_reduce.default, (t, "sum", "g9"))  # a group nobody named
    assert cs.reset() == (
        {
            "other/all_gather/dp_shard": 2,
            "other/all_reduce/group:g9": 1,
            "other/all_reduce/tp": 2,
            "other/reduce_scatter/dp_shard": 1,
        },
        {
            "other/all_gather/dp_shard": 4 * 128 + 2 * (128 + 32),
            "other/all_reduce/group:g9": 128,
            "other/all_reduce/tp": 256,
            "other/reduce_scatter/dp_shard": 128,
        },
    )


def test_record_c10d_ops_count_the_larger_side():
    cs = CommStats({})
    small, big = torch.zeros(2), torch.zeros(8)
    cs._record("all_gather", C10D._allgather_base_.default, (big, small))  # output is larger
    cs._record(
        "reduce_scatter", C10D._reduce_scatter_base_.default, (small, big)
    )  # input is larger
    cs._record("all_reduce", C10D.allreduce_.default, ([small, small],))  # no second argument
    cs._record("all_gather", C10D.allgather_.default, ([[small, small, small]], [small]))
    counts, nbytes = cs.reset()
    # no group name anywhere: the mesh dimension is "world"
    assert counts == {
        "other/all_gather/world": 2,
        "other/all_reduce/world": 1,
        "other/reduce_scatter/world": 1,
    }
    assert nbytes == {
        "other/all_gather/world": 32 + 24,
        "other/all_reduce/world": 16,
        "other/reduce_scatter/world": 32,
    }


def test_reset_returns_sorted_dicts_and_starts_anew():
    cs = CommStats({"a": "tp"})
    t = torch.zeros(1)
    for phase in ("other", "forward", "backward"):
        cs.phase_name = phase
        cs._record("all_reduce", FUNC.all_reduce.default, (t, "sum", "a"))
        cs._record("broadcast", FUNC.broadcast.default, (t, 0, "a"))
    counts, nbytes = cs.reset()
    assert type(counts) is dict and type(nbytes) is dict
    assert (
        list(counts)
        == sorted(counts)
        == [
            "backward/all_reduce/tp",
            "backward/broadcast/tp",
            "forward/all_reduce/tp",
            "forward/broadcast/tp",
            "other/all_reduce/tp",
            "other/broadcast/tp",
        ]
    )
    assert list(nbytes) == list(counts)
    assert set(counts.values()) == {1} and set(nbytes.values()) == {4}
    assert cs.reset() == ({}, {})
    cs._record("all_reduce", FUNC.all_reduce.default, (t, "sum", "a"))
    assert cs.reset() == ({"backward/all_reduce/tp": 1}, {"backward/all_reduce/tp": 4})


def test_phase_context_manager_nests_and_restores():
    cs = CommStats({"a": "pp"})
    t = torch.zeros(2)

    def record():
        cs._record("all_reduce", FUNC.all_reduce.default, (t, "sum", "a"))

    cs.phase_name = "forward"
    with cs.phase("backward"):
        record()
        with cs.phase("other"):
            record()
            assert cs.forced == ["backward", "other"]
        record()
    record()
    assert cs.forced == []
    assert cs.reset()[0] == {
        "backward/all_reduce/pp": 2,
        "other/all_reduce/pp": 1,
        "forward/all_reduce/pp": 1,
    }


def test_phase_is_restored_after_an_exception():
    cs = CommStats({})
    with pytest.raises(RuntimeError, match="boom"):
        with cs.phase("backward"):
            raise RuntimeError("boom")
    assert cs.forced == []
    cs._record("all_reduce", FUNC.all_reduce.default, (torch.zeros(1), "sum", "x"))
    assert cs.reset()[0] == {"other/all_reduce/group:x": 1}


def test_autograd_backward_overrides_the_forced_phase():
    cs = CommStats({"g": "dp_shard"})

    class RecordInBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            with cs.phase("forward"):
                cs._record(
                    "reduce_scatter", FUNC.reduce_scatter_tensor.default, (grad, "sum", 1, "g")
                )
            return grad

    cs.phase_name = "forward"
    x = torch.ones(5, requires_grad=True)
    with cs.phase("other"):
        RecordInBackward.apply(x).sum().backward()
    assert cs.reset() == (
        {"backward/reduce_scatter/dp_shard": 1},
        {"backward/reduce_scatter/dp_shard": 20},
    )


def test_mode_ignores_ordinary_ops():
    with CommStats({}) as cs:
        x = torch.ones(3, requires_grad=True)
        y = (x * 2 + 1).sum()
        y.backward()
        torch.matmul(torch.ones(2, 2), torch.ones(2, 2))
    assert x.grad.tolist() == [2.0, 2.0, 2.0]
    assert cs.reset() == ({}, {})


class FakeGroup:
    def __init__(self, name):
        self.group_name = name


class FakeSubMesh:
    def __init__(self, group_name):
        self.group_name = group_name

    def get_group(self):
        if self.group_name is None:
            raise RuntimeError("this dimension has no process group")
        return FakeGroup(self.group_name)


class FakeMesh:
    """mesh[name].get_group(): "tp" has no group (RuntimeError), "dp_shard_tp" does not exist."""

    mesh_dim_names = ("pp", "dp_shard", "tp")
    groups = {"pp": "g1", "dp_shard": "g2", "tp": None, "dp": "g5"}

    def __getitem__(self, name):
        if name not in self.groups:
            raise KeyError(name)
        return FakeSubMesh(self.groups[name])


def test_mesh_group_dims_without_a_process_group():
    if dist.is_initialized():
        pytest.skip("a default process group exists in this process")
    assert mesh_group_dims(FakeMesh(), ("dp", "dp_shard_tp")) == {
        "g1": "pp",
        "g2": "dp_shard",
        "g5": "dp",
    }
    assert mesh_group_dims(FakeMesh()) == {"g1": "pp", "g2": "dp_shard"}


# --------------------------------------------------------------------------- one real gloo rank


# (gloo_world: tests/unit/conftest.py)


class AllReduceInBackward(torch.autograd.Function):
    """Identity forward; the backward all-reduces the gradient (like a data-parallel hook)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_real_collectives_by_phase(gloo_world):
    import torch.distributed._functional_collectives as funcol

    with CommStats({gloo_world.group_name: "world_dim"}) as cs:
        t = torch.arange(4, dtype=torch.float32)  # 16 bytes
        dist.all_reduce(t)
        out = torch.empty(4)
        dist.all_gather_into_tensor(out, t)
        reduced = funcol.wait_tensor(funcol.all_reduce(t, "sum", dist.group.WORLD))
        x = torch.ones(3, requires_grad=True)  # 12 bytes
        AllReduceInBackward.apply(x).sum().backward()
    counts, nbytes = cs.reset()
    assert counts == {
        "backward/all_reduce/world_dim": 1,
        "other/all_gather/world_dim": 1,
        "other/all_reduce/world_dim": 2,
    }
    assert nbytes == {
        "backward/all_reduce/world_dim": 12,
        "other/all_gather/world_dim": 16,
        "other/all_reduce/world_dim": 32,
    }
    # one rank: the collectives ran and returned the input unchanged
    assert out.tolist() == reduced.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert x.grad.tolist() == [1.0, 1.0, 1.0]


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_real_collectives_forward_phase_and_forced_backward(gloo_world):
    with CommStats({gloo_world.group_name: "dp_shard"}) as cs:
        cs.phase_name = "forward"
        t = torch.ones(8)  # 32 bytes
        dist.broadcast(t, src=0)
        x = torch.ones(2, requires_grad=True)
        AllReduceInBackward.apply(x).sum().backward()  # autograd: backward, not forward
        with cs.phase("backward"):  # e.g. the pipeline's deferred gradient reduction
            dist.reduce_scatter_tensor(torch.empty(8), t)
        cs.phase_name = "other"
        dist.all_reduce(t)
    assert cs.reset() == (
        {
            "backward/all_reduce/dp_shard": 1,
            "backward/reduce_scatter/dp_shard": 1,
            "forward/broadcast/dp_shard": 1,
            "other/all_reduce/dp_shard": 1,
        },
        {
            "backward/all_reduce/dp_shard": 8,
            "backward/reduce_scatter/dp_shard": 32,
            "forward/broadcast/dp_shard": 32,
            "other/all_reduce/dp_shard": 32,
        },
    )


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_real_functional_gathers_and_unknown_groups(gloo_world):
    import torch.distributed._functional_collectives as funcol

    name = gloo_world.group_name
    with CommStats({}) as cs:  # the group is not a named mesh dimension
        t = torch.ones(6)  # 24 bytes
        gathered = funcol.wait_tensor(funcol.all_gather_tensor(t, 0, dist.group.WORLD))
        scattered = funcol.wait_tensor(
            funcol.reduce_scatter_tensor(torch.ones(10), "sum", 0, dist.group.WORLD)
        )
        gathered_list = [torch.empty(6)]
        dist.all_gather(gathered_list, t)
    assert gathered.shape == (6,) and scattered.shape == (10,)
    assert cs.reset() == (
        {f"other/all_gather/group:{name}": 2, f"other/reduce_scatter/group:{name}": 1},
        {f"other/all_gather/group:{name}": 24 + 24, f"other/reduce_scatter/group:{name}": 40},
    )


def test_group_name_of_a_boxed_process_group(gloo_world):
    boxed = dist.ProcessGroup.boxed(gloo_world)
    assert group_name_of((torch.zeros(1), boxed, "sum"), {}) == gloo_world.group_name


def test_mesh_group_dims_adds_the_world_group(gloo_world):
    # A fake mesh whose groups are not the world: the world is added as "world".
    assert mesh_group_dims(FakeMesh(), ("dp",)) == {
        "g1": "pp",
        "g2": "dp_shard",
        "g5": "dp",
        gloo_world.group_name: "world",
    }


def test_mesh_group_dims_of_a_real_one_rank_mesh(gloo_world):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp_shard",))
    group = mesh["dp_shard"].get_group()
    dims = mesh_group_dims(mesh)
    assert dims[group.group_name] == "dp_shard"
    # The mesh dimension's own name wins over the generic "world" when they are one group.
    assert dims == (
        {group.group_name: "dp_shard"}
        if group.group_name == gloo_world.group_name
        else {group.group_name: "dp_shard", gloo_world.group_name: "world"}
    )


def test_simple_fsdp_unit_gather_is_one_all_gather_in_the_param_dtype(gloo_world):
    from torchtitan.distributed.simple_fsdp import GATHER_OP

    shards = [
        torch.arange(6, dtype=torch.float32).view(2, 3),
        torch.arange(6, 10, dtype=torch.float32),
    ]
    with CommStats({gloo_world.group_name: "dp_shard"}) as cs:
        w, b = GATHER_OP(shards, 1, gloo_world.group_name, torch.bfloat16, [6, 4], [2, 2, 3, 1, 4])
        GATHER_OP(shards, 1, "", torch.float32, [6, 4], [2, 2, 3, 1, 4])  # DDP: nothing to gather
    # one collective however many parameters; bytes in the gathered dtype (bf16: 2 per element)
    assert cs.reset() == ({"other/all_gather/dp_shard": 1}, {"other/all_gather/dp_shard": 20})
    assert w.dtype == b.dtype == torch.bfloat16
    assert w.tolist() == [[0, 1, 2], [3, 4, 5]] and b.tolist() == [6, 7, 8, 9]
