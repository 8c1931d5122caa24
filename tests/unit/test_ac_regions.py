"""activation_checkpoint's two pure pieces, without running a model:

- region_policy, driven by a fake op stream: the policy function is called directly, the way
  SAC's caching mode calls it in forward, after the op ran (ctx with the op's output, func,
  *args), and every answer is compared with the exact CheckpointPolicy it must give; then
  once through real SAC (checkpoint_wrapper), with the collectives run by a local stand-in
  for a process group, forward and recompute;
- region_specs / block_compute / resolve_fsdp_comm and RegionSpec's wrapped / label, as
  tables over the AC modes, fsdp_ac_policy, SimpleFSDP on/off and compile on/off."""

import pytest
import torch
from torch import nn
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import CheckpointPolicy, SelectiveCheckpointContext

from torchtitan.config.job_config import ActivationCheckpoint
from torchtitan.distributed.activation_checkpoint import (
    SAVE_OPS,
    RegionSpec,
    block_compute,
    region_policy,
    region_specs,
    resolve_fsdp_comm,
    wrap_region,
)
from torchtitan.distributed.expert_parallel import SAC_SAVE_OPS
from torchtitan.distributed.simple_fsdp import GATHER_OP

aten = torch.ops.aten
_fc = torch.ops._c10d_functional

SAVE = CheckpointPolicy.MUST_SAVE
MUST_RE = CheckpointPolicy.MUST_RECOMPUTE
RE = CheckpointPolicy.PREFER_RECOMPUTE

A2A = _fc.all_to_all_single.default
WAIT = _fc.wait_tensor.default
WRAP = _fc._wrap_tensor_autograd.default
ALL_GATHER = _fc.all_gather_into_tensor.default
REDUCE_SCATTER = _fc.reduce_scatter_tensor.default

# Group names as SAC sees them: FSDP's (dense dp_shard, and the experts' data-parallel dims)
# and three that are not FSDP's. Real names are numbers ("0", "3"); only membership matters.
DP, EXPERTS_DP, TP, EP, CP = (
    "group_dp_shard",
    "group_experts_fsdp",
    "group_tp",
    "group_ep",
    "group_cp",
)
FSDP_GROUPS = frozenset({DP, EXPERTS_DP})
EP_OPS = frozenset(SAC_SAVE_OPS)

T = torch.zeros(2)  # a stand-in argument: the policy must not need real values

# A stream item is (op, args, output): SAC asks the policy after the op ran, with its output
# as ctx.op_output. Each op gets a fresh output; a wait takes its collective's as argument.


def gather(group: str):
    """One SimpleFSDP unit gather as SAC sees it, the group name at index 2."""
    return GATHER_OP, ([T], 2, group, torch.bfloat16, [2], [1, 4]), torch.zeros(2)


def a2a(group: str = EP):
    return A2A, (T, [1, 1], [1, 1], group), torch.zeros(2)


def op(func, *args):
    return func, args or (T,), torch.zeros(2)


def wait(of=None):
    """A wait on a collective's output (given its stream item), on a given tensor (e.g. the
    AsyncCollectiveTensor eager funcol hands out), or (None) on a tensor of no collective."""
    t = of[2] if isinstance(of, tuple) else torch.zeros(2) if of is None else of
    return WAIT, (t,), t


def answers(policy, stream) -> list[CheckpointPolicy]:
    return [
        policy(SelectiveCheckpointContext(is_recompute=False, op_output=out), func, *args)
        for func, args, out in stream
    ]


def ep_policy(spec=RegionSpec("op", None)):
    return region_policy(spec, FSDP_GROUPS, EP_OPS)


# --------------------------------------------------------------------------------------------
# region_policy: compute decision


def test_save_ops_are_the_matmuls_the_attention_kernels_and_float8_amaxes():
    attention = {
        getattr(aten, n).default
        for n in (
            "_scaled_dot_product_flash_attention",
            "_scaled_dot_product_efficient_attention",
            "_scaled_dot_product_cudnn_attention",
            "_scaled_dot_product_flash_attention_for_cpu",
        )
        if hasattr(aten, n)
    }
    assert aten._scaled_dot_product_flash_attention_for_cpu.default in attention  # what CPU runs
    cuda_attention = {torch.ops.higher_order.flex_attention, aten._flash_attention_forward.default}
    amax = {aten.max.default}  # float8's scales (test_float8.py)
    assert SAVE_OPS == {aten.mm.default, aten.addmm.default, aten.bmm.default} | (
        attention | cuda_attention | amax
    )


@pytest.mark.parametrize("func", sorted(SAVE_OPS, key=str), ids=str)
def test_op_sac_saves_each_save_op_and_full_ac_recomputes_it(func):
    assert answers(region_policy(RegionSpec("op", None), frozenset()), [op(func)]) == [SAVE]
    assert answers(region_policy(RegionSpec("full", "save"), FSDP_GROUPS), [op(func)]) == [RE]
    assert answers(region_policy(RegionSpec("none", "recompute"), FSDP_GROUPS), [op(func)]) == [
        SAVE
    ]


# Cheap ops op SAC recomputes: casts (never saved: a cast of a parameter would keep a copy
# of it), views, norms, activations, elementwise, routing index math; matmul / linear are
# composite (SAC only ever sees the mm they decompose to), so not named.
CHEAP = [
    aten._to_copy.default,
    aten.add.Tensor,
    aten.mul.Tensor,
    aten.silu.default,
    aten.view.default,
    aten.t.default,
    aten.cat.default,
    aten.index.Tensor,
    aten.cumsum.default,
    aten._unsafe_view.default,
    aten.rsqrt.default,
    aten.matmul.default,
    aten.linear.default,
]


USER_REGIONS = [
    RegionSpec(compute, comm) for compute in ("op", "full") for comm in (None, "save", "recompute")
]


@pytest.mark.parametrize("spec", USER_REGIONS, ids=lambda s: s.label)
def test_cheap_ops_and_casts_are_recomputed_in_every_user_region(spec):
    for extra in (frozenset(), EP_OPS):
        policy = region_policy(spec, FSDP_GROUPS, extra)
        assert answers(policy, [op(f) for f in CHEAP]) == [RE] * len(CHEAP), (spec, extra)


def test_full_ac_recomputes_the_all_to_alls_and_their_waits():
    x, y = a2a(), a2a()
    stream = [x, op(WRAP), wait(x), op(aten.mm.default), y, wait(y)]
    for comm in (None, "save", "recompute"):
        assert (
            answers(region_policy(RegionSpec("full", comm), FSDP_GROUPS, EP_OPS), stream)
            == [RE] * 6
        ), comm


def test_gather_only_region_saves_everything_but_the_fsdp_gather():
    policy = region_policy(RegionSpec("none", "recompute"), FSDP_GROUPS, EP_OPS)
    x = a2a()
    stream = [
        gather(DP),
        op(aten._to_copy.default),
        op(aten.mm.default),
        gather(TP),
        gather(EXPERTS_DP),
        x,
        wait(x),
        wait(x),
        op(aten.silu.default),
        gather(""),
    ]
    assert answers(policy, stream) == [
        MUST_RE,
        SAVE,
        SAVE,
        SAVE,
        MUST_RE,
        SAVE,
        SAVE,
        SAVE,
        SAVE,
        SAVE,
    ]


# --------------------------------------------------------------------------------------------
# region_policy: SimpleFSDP's gather, recognised by its group only

GATHER_TABLE = [
    # (compute, fsdp_comm, group) -> policy
    ("op", "save", DP, SAVE),
    ("op", "recompute", DP, MUST_RE),
    ("op", "save", EXPERTS_DP, SAVE),
    ("op", "recompute", EXPERTS_DP, MUST_RE),
    ("full", "save", DP, SAVE),
    ("full", "recompute", DP, MUST_RE),
    ("none", "recompute", DP, MUST_RE),
    ("none", "save", DP, SAVE),
    # the same op over a group that is not FSDP's follows the compute decision
    ("op", "save", TP, RE),
    ("op", "recompute", EP, RE),
    ("op", "recompute", "", RE),
    ("full", "save", TP, RE),
    ("full", "recompute", EP, RE),
    ("none", "recompute", TP, SAVE),
    ("none", "recompute", "", SAVE),
    # no FSDP comm decision (FSDP2 or no SimpleFSDP): never recognised, even on a dp group
    ("op", None, DP, RE),
    ("full", None, DP, RE),
    ("none", None, DP, SAVE),
]


@pytest.mark.parametrize("compute, comm, group, expected", GATHER_TABLE)
def test_fsdp_gather_follows_the_comm_decision_only_on_fsdp_groups(compute, comm, group, expected):
    for extra in (frozenset(), EP_OPS):
        assert answers(
            region_policy(RegionSpec(compute, comm), FSDP_GROUPS, extra), [gather(group)]
        ) == [expected]


def test_without_fsdp_groups_no_gather_is_fsdps():
    policy = region_policy(RegionSpec("op", "recompute"), frozenset())
    assert answers(policy, [gather(DP), gather("")]) == [RE, RE]


def test_fsdp_group_name_does_not_make_other_ops_fsdps():
    # only GATHER_OP is recognised: a bare all-gather on a dp group (or its wait) is not
    policy = region_policy(RegionSpec("op", "recompute"), FSDP_GROUPS, EP_OPS)
    ag, rs = op(ALL_GATHER, T, 2, DP), op(REDUCE_SCATTER, T, "sum", 2, DP)
    assert answers(policy, [ag, wait(ag), rs, wait(rs)]) == [RE, RE, RE, RE]


# --------------------------------------------------------------------------------------------
# region_policy: expert parallel's all-to-alls and the waits that complete them


def test_all_to_all_then_two_waits_saves_only_the_first_wait():
    # traced code waits twice on an all-to-all's output (funcol, then the caller): one is its own
    x = a2a()
    assert answers(ep_policy(), [x, wait(x), wait(x)]) == [SAVE, SAVE, RE]


def test_wrap_tensor_autograd_is_saved_and_does_not_open_a_wait():
    x, w = a2a(), op(WRAP)
    assert answers(ep_policy(), [x, op(WRAP, x[2]), wait(x), w, wait(w)]) == [
        SAVE,
        SAVE,
        SAVE,
        SAVE,
        RE,
    ]


def test_two_all_to_alls_then_their_waits_in_any_order_are_all_saved_and_a_third_wait_is_not():
    x, y = a2a(), a2a()
    stream = [x, y, op(aten.add.Tensor), wait(x), op(aten.mm.default), wait(y), wait()]
    assert answers(ep_policy(), stream) == [SAVE, SAVE, RE, SAVE, SAVE, SAVE, RE]
    x, y = a2a(), a2a()
    assert answers(ep_policy(), [x, y, wait(y), wait(x)]) == [SAVE] * 4


def test_waits_before_any_all_to_all_are_not_saved():
    # TP's and FSDP's own waits come with no all-to-all in flight
    ag, rs, x = op(ALL_GATHER, T, 2, TP), op(REDUCE_SCATTER, T, "sum", 2, DP), a2a()
    stream = [ag, wait(ag), rs, wait(rs), x, wait(x)]
    assert answers(ep_policy(), stream) == [RE, RE, RE, RE, SAVE, SAVE]


def test_a_wait_after_the_pairs_are_balanced_is_not_saved():
    x, y, ag, z = a2a(), a2a(), op(ALL_GATHER, T, 2, TP), a2a()
    stream = [x, wait(x), y, wait(y), ag, wait(ag), z, wait(z)]
    assert answers(ep_policy(), stream) == [SAVE, SAVE, SAVE, SAVE, RE, RE, SAVE, SAVE]


def test_an_all_to_all_on_any_group_is_saved_under_op_sac():
    # the op alone does not name the group (expert_parallel's docstring): TP's would be kept too
    x, y = a2a(TP), a2a(DP)
    assert answers(ep_policy(), [x, wait(x), y, wait(y)]) == [SAVE] * 4


def test_one_moe_block_under_op_sac_with_fsdp_gathers_recomputed():
    """The stream of a MoE block (SimpleFSDP + TP + EP), as op SAC sees it in forward; eager
    funcol waits on the AsyncCollectiveTensor that _wrap_tensor_autograd makes of the output."""
    sp, rs, counts, dispatch, combine, shared_rs = (
        op(ALL_GATHER, T, 2, TP),
        op(REDUCE_SCATTER, T, "sum", 2, TP),
        a2a(),
        a2a(),
        a2a(),
        op(REDUCE_SCATTER, T, "sum", 2, TP),
    )
    stream = [
        (gather(DP), MUST_RE),  # the block's dense unit
        (sp, RE),
        (wait(sp), RE),  # sequence parallel -> replicate
        (op(aten.mm.default), SAVE),
        (op(aten._to_copy.default), RE),
        (op(aten._scaled_dot_product_flash_attention_for_cpu.default), SAVE),
        (rs, RE),
        (wait(rs), RE),
        (op(aten.mm.default), SAVE),
        (op(aten.topk.default), RE),  # router
        (gather(EXPERTS_DP), MUST_RE),  # the routed experts' unit
        (counts, SAVE),
        (op(WRAP, counts[2]), SAVE),
        (wait(AsyncCollectiveTensor(counts[2])), SAVE),
        (op(aten.cat.default), RE),
        (op(aten.sum.dim_IntList), RE),
        (dispatch, SAVE),
        (op(WRAP, dispatch[2]), SAVE),  # dispatch, waited after the regroup index is built
        (op(aten.cumsum.default), RE),
        (op(aten.repeat_interleave.Tensor), RE),
        (wait(AsyncCollectiveTensor(dispatch[2])), SAVE),
        (op(aten.index.Tensor), RE),
        (op(aten.silu.default), RE),
        (combine, SAVE),
        (op(WRAP, combine[2]), SAVE),  # combine, with the shared experts' TP
        (op(aten.mm.default), SAVE),
        (shared_rs, RE),
        (wait(shared_rs), RE),  # wait in between
        (wait(AsyncCollectiveTensor(combine[2])), SAVE),
        (op(aten.add.Tensor), RE),
    ]
    policy = region_policy(RegionSpec("op", "recompute"), FSDP_GROUPS, EP_OPS)
    assert answers(policy, [s for s, _ in stream]) == [p for _, p in stream]


def test_without_extra_save_ops_all_to_alls_and_waits_are_recomputed():
    x = a2a()
    assert answers(region_policy(RegionSpec("op", None), frozenset()), [x, op(WRAP), wait(x)]) == [
        RE,
        RE,
        RE,
    ]


def test_only_the_extra_ops_named_are_saved():
    x = a2a()
    no_wait = region_policy(RegionSpec("op", None), frozenset(), frozenset({A2A}))
    assert answers(no_wait, [x, wait(x), op(WRAP)]) == [SAVE, RE, RE]
    # a wait alone is never paired: it completes no all-to-all that was kept
    only_wait = region_policy(RegionSpec("op", None), frozenset(), frozenset({WAIT}))
    assert answers(only_wait, [x, wait(x)]) == [RE, RE]
    # another collective named extra is kept, but does not make its wait kept
    ag = op(ALL_GATHER, T, 2, TP)
    gathers = region_policy(RegionSpec("op", None), frozenset(), frozenset({ALL_GATHER, WAIT}))
    assert answers(gathers, [ag, wait(ag)]) == [SAVE, RE]


def test_a_fresh_policy_does_not_inherit_pending_all_to_alls():
    first, x, y = ep_policy(), a2a(), a2a()
    assert answers(first, [x, y]) == [SAVE, SAVE]  # two left in flight
    second = ep_policy()  # the next region (or the next forward of the same region)
    assert answers(second, [wait(x)]) == [RE]
    assert answers(first, [wait(x), wait(y), wait()]) == [SAVE, SAVE, RE]
    z = a2a()
    assert answers(second, [z, wait(z), wait(z)]) == [SAVE, SAVE, RE]


def test_each_wrapped_region_call_gets_a_fresh_policy_from_one_shared_context_fn():
    """wrap_region: equal regions share one context_fn object (torch.compile guards on it),
    and each checkpointed call builds its own policy (no collective in flight carried over)."""
    spec = RegionSpec("op", "recompute")
    a = wrap_region(nn.Linear(2, 2), spec, {DP, EXPERTS_DP}, SAC_SAVE_OPS)
    b = wrap_region(nn.Linear(2, 2), spec, [EXPERTS_DP, DP], list(SAC_SAVE_OPS))
    context_fn = a.checkpoint_fn.keywords["context_fn"]
    assert b.checkpoint_fn.keywords["context_fn"] is context_fn
    first, second = context_fn()[0].policy_fn, context_fn()[0].policy_fn
    assert first is not second
    x = a2a()
    assert answers(first, [x, gather(DP), gather(TP)]) == [SAVE, MUST_RE, RE]
    assert answers(second, [wait(x)]) == [RE]
    assert answers(first, [wait(x)]) == [SAVE]


def test_a_tp_wait_inside_an_all_to_all_pair_is_not_saved():
    """The all-to-all's own wait (its output as argument) is kept; TP's wait, which
    completes no all-to-all, is not, even while an all-to-all is in flight. SAC calls the
    policy after the op ran, with its output as ctx.op_output."""
    policy = ep_policy()
    a2a_out, ag_out = torch.zeros(2), torch.zeros(4)

    def ask(func, args, out):
        return policy(SelectiveCheckpointContext(is_recompute=False, op_output=out), func, *args)

    got = [
        ask(A2A, (T, [1, 1], [1, 1], EP), a2a_out),
        ask(ALL_GATHER, (T, 2, TP), ag_out),
        ask(WAIT, (ag_out,), ag_out),
        ask(WAIT, (a2a_out,), a2a_out),
    ]
    assert got == [SAVE, RE, RE, SAVE]


def test_a_wait_on_an_async_collective_tensor_is_paired_through_it():
    # eager funcol: the wait gets the AsyncCollectiveTensor wrapping the output (or a view of it)
    x, ag = a2a(), op(ALL_GATHER, T, 2, TP)
    stream = [
        x,
        op(WRAP, x[2]),
        ag,
        wait(AsyncCollectiveTensor(ag[2])),
        wait(AsyncCollectiveTensor(x[2].view(1, 2))),
    ]
    assert answers(ep_policy(), stream) == [SAVE, SAVE, RE, RE, SAVE]


def test_a_wait_on_a_storage_less_tensor_is_recomputed():
    class NoStorage(torch.Tensor):  # a wrapper subclass, as DTensor: no storage of its own
        @staticmethod
        def __new__(cls):
            return torch.Tensor._make_wrapper_subclass(cls, (2,))

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            return NotImplemented

    x = a2a()
    assert answers(ep_policy(), [x, wait(NoStorage()), wait(x)]) == [SAVE, RE, SAVE]


# --------------------------------------------------------------------------------------------
# region_policy: context parallel's K/V gathers (save_groups) and their waits


def cp_policy(spec=RegionSpec("op", "recompute"), extra=frozenset()):
    return region_policy(spec, FSDP_GROUPS, extra, frozenset({CP}))


def test_cp_gathers_own_wait_is_saved_and_a_tp_wait_in_between_is_not():
    k, tp = op(ALL_GATHER, T, 2, CP), op(ALL_GATHER, T, 2, TP)
    stream = [k, tp, wait(tp), wait(k), op(aten.cat.default), wait()]
    assert answers(cp_policy(), stream) == [SAVE, RE, RE, SAVE, RE, RE]


def test_cp_gathers_waits_are_paired_in_any_order_and_once():
    k, v = op(ALL_GATHER, T, 2, CP), op(ALL_GATHER, T, 2, CP)
    assert answers(cp_policy(), [k, v, wait(v), wait(k), wait(k)]) == [SAVE, SAVE, SAVE, SAVE, RE]


def test_cp_gathers_wait_on_a_view_of_its_output_is_saved():
    # eager, batch 1: funcol reshapes the gather's AsyncCollectiveTensor (a view) before the
    # wait; attention then waits again on the (already waited) result
    k = op(ALL_GATHER, T, 2, CP)
    viewed = AsyncCollectiveTensor(k[2].view(1, 2))
    assert answers(cp_policy(), [k, op(aten.view.default), wait(viewed), wait(viewed.elem)]) == [
        SAVE,
        RE,
        SAVE,
        RE,
    ]


def test_cp_alltoall_ring_shift_and_its_wait_are_kept_only_on_cp_groups():
    # rotate_method=alltoall: each K/V shift is an all_to_all_single on the CP group (no
    # EP in the region, so all_to_all is not among the extra save ops)
    k, other = a2a(CP), a2a(TP)
    stream = [k, other, wait(other), wait(k)]
    assert answers(cp_policy(), stream) == [SAVE, RE, RE, SAVE]
    k = a2a(CP)
    assert answers(cp_policy(RegionSpec("full", "recompute")), [k, wait(k)]) == [RE, RE]


def test_cp_and_ep_collectives_in_flight_together_each_keep_their_own_wait():
    k, x, tp = op(ALL_GATHER, T, 2, CP), a2a(), op(REDUCE_SCATTER, T, "sum", 2, TP)
    stream = [x, k, tp, wait(tp), wait(k), wait(x)]
    assert answers(cp_policy(extra=EP_OPS), stream) == [SAVE, SAVE, RE, RE, SAVE, SAVE]


def test_cp_gathers_are_kept_only_under_op_sac_and_only_on_cp_groups():
    for spec, expected in (
        (RegionSpec("full", "recompute"), [RE, RE]),
        (RegionSpec("none", "recompute"), [SAVE, SAVE]),
    ):
        k = op(ALL_GATHER, T, 2, CP)
        assert answers(cp_policy(spec), [k, wait(k)]) == expected, spec
    other = op(ALL_GATHER, T, 2, TP)
    assert answers(cp_policy(), [other, wait(other)]) == [RE, RE]
    k = op(ALL_GATHER, T, 2, CP)
    assert answers(region_policy(RegionSpec("op", None), FSDP_GROUPS), [k, wait(k)]) == [
        RE,
        RE,
    ]  # no save_groups


# --------------------------------------------------------------------------------------------
# region_policy inside real SAC: forward, then the recompute in backward


class LocalCollectives(TorchDispatchMode):
    """A stand-in for process groups of one rank (no group is created): the functional
    collectives run locally as copies, a wait hands back the tensor it completes (as c10d's
    does), and each collective or wait that really runs is logged by the collective it
    belongs to."""

    def __init__(self):
        super().__init__()
        self.log: list[str] = []
        self.names = {}  # output storage -> "op/group"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (A2A, ALL_GATHER):
            out = args[0].clone()
            self.names[out.untyped_storage()] = name = f"{func.__name__.split('.')[0]}/{args[-1]}"
            self.log.append(name)
            return out
        if func == WAIT:
            t = args[0].elem if isinstance(args[0], AsyncCollectiveTensor) else args[0]
            self.log.append("wait " + self.names.get(t.untyped_storage(), "?"))
            return t
        return func(*args, **(kwargs or {}))


class CollectivesBlock(nn.Module):
    """An EP all-to-all waited eagerly (through _wrap_tensor_autograd's AsyncCollectiveTensor)
    with TP's gather and wait inside the pair, then CP's gather, waited on a view of it. The
    collectives move `data` (no grad: backward runs none of its own), and the products keep
    their results for backward, so backward recomputes the region."""

    def forward(self, x, data):
        ep = WRAP(A2A(data + 1, [4], [4], EP))
        tp = WAIT(ALL_GATHER(data * 3, 1, TP))
        ep = WAIT(ep)
        kv = WAIT(WRAP(ALL_GATHER(ep * tp, 1, CP)).view(2, 2))
        return (x * ep * tp * kv.view(4)).sin()


def test_recompute_reruns_exactly_the_recomputed_collectives_in_forward_order():
    block = wrap_region(
        CollectivesBlock(), RegionSpec("op", "recompute"), FSDP_GROUPS, SAC_SAVE_OPS, {CP}
    )
    data = torch.arange(4.0)
    reference = torch.randn(4, requires_grad=True)
    with LocalCollectives():
        CollectivesBlock()(reference, data).sum().backward()
    for _ in range(2):  # a second forward of the same region: a fresh policy
        comm = LocalCollectives()
        x = reference.detach().clone().requires_grad_()
        with comm:
            y = block(x, data)
            forward = list(comm.log)
            y.sum().backward()
        assert forward == [
            "all_to_all_single/group_ep",
            "all_gather_into_tensor/group_tp",
            "wait all_gather_into_tensor/group_tp",
            "wait all_to_all_single/group_ep",
            "all_gather_into_tensor/group_cp",
            "wait all_gather_into_tensor/group_cp",
        ]
        # only TP's gather and its own wait run again; the all-to-all, the CP gather and their
        # waits come from the forward's cache (by call index, as the policy answered)
        assert comm.log[len(forward) :] == [
            "all_gather_into_tensor/group_tp",
            "wait all_gather_into_tensor/group_tp",
        ]
        torch.testing.assert_close(x.grad, reference.grad, rtol=0, atol=0)


# --------------------------------------------------------------------------------------------
# RegionSpec


@pytest.mark.parametrize(
    "spec, wrapped, label",
    [
        (RegionSpec("none", None), False, "no AC"),
        (RegionSpec("none", "recompute"), True, "no AC, FSDP gathers recomputed"),
        (RegionSpec("none", "recompute", by_hooks=True), False, "no AC, FSDP gathers recomputed"),
        (RegionSpec("full", None), True, "full AC"),
        (RegionSpec("full", "save"), True, "full AC, FSDP gathers saved"),
        (RegionSpec("full", "recompute"), True, "full AC, FSDP gathers recomputed"),
        (RegionSpec("op", None), True, "op SAC"),
        (RegionSpec("op", "save"), True, "op SAC, FSDP gathers saved"),
        (RegionSpec("op", "recompute"), True, "op SAC, FSDP gathers recomputed"),
    ],
)
def test_region_spec_wrapped_and_label(spec, wrapped, label):
    assert (spec.wrapped, spec.label) == (wrapped, label)


# --------------------------------------------------------------------------------------------
# block_compute / resolve_fsdp_comm / region_specs


def ac(mode="none", option="op", policy="auto") -> ActivationCheckpoint:
    return ActivationCheckpoint(mode=mode, selective_ac_option=option, fsdp_ac_policy=policy)


BLOCK_COMPUTE = [
    (ac("none"), ["none"] * 7),
    (ac("none", "2"), ["none"] * 7),  # the option matters only under selective
    (ac("full"), ["full"] * 7),
    (ac("full", "2"), ["full"] * 7),
    (ac("selective", "op"), ["op"] * 7),
    (ac("selective", "1"), ["full"] * 7),
    (ac("selective", "2"), ["full", "none", "full", "none", "full", "none", "full"]),
    (ac("selective", "3"), ["full", "none", "none", "full", "none", "none", "full"]),
]


@pytest.mark.parametrize(
    "cfg, expected",
    BLOCK_COMPUTE,
    ids=[f"{c.mode}-{c.selective_ac_option}" for c, _ in BLOCK_COMPUTE],
)
def test_block_compute(cfg, expected):
    assert [block_compute(cfg, position) for position in range(7)] == expected


def test_block_compute_takes_a_simple_namespace_too():
    from types import SimpleNamespace

    assert block_compute(SimpleNamespace(mode="selective", selective_ac_option="4"), 8) == "full"
    assert block_compute(SimpleNamespace(mode="selective", selective_ac_option="4"), 6) == "none"


@pytest.mark.parametrize(
    "policy, reshard, simple, expected",
    [
        ("auto", True, True, "recompute"),
        ("auto", False, True, "save"),
        ("save", True, True, "save"),
        ("save", False, True, "save"),
        ("recompute", True, True, "recompute"),
        ("recompute", False, True, "recompute"),
        ("auto", True, False, None),
        ("auto", False, False, None),
        ("save", True, False, None),
        ("recompute", False, False, None),
    ],
)
def test_resolve_fsdp_comm(policy, reshard, simple, expected):
    assert resolve_fsdp_comm(policy, reshard, simple) == expected


BLOCKS = ["layers.0", "layers.1", "layers.2", "layers.3"]
# layers.3 is absent from the plan: it counts as kept (not resharded)
RESHARD = {"layers.0": False, "layers.1": True, "layers.2": True}

N, HOOKS, SAC_RE = (
    RegionSpec("none", None),
    RegionSpec("none", "recompute", True),
    RegionSpec("none", "recompute"),
)

SPECS_TABLE = [
    # (mode, option, fsdp_ac_policy, simple_fsdp, compiled) -> specs of BLOCKS
    (("none", "op", "auto", False, False), [N, N, N, N]),
    (("none", "op", "auto", False, True), [N, N, N, N]),
    (("none", "op", "auto", True, False), [N, HOOKS, HOOKS, N]),  # eager: re-gather by hooks
    (("none", "op", "auto", True, True), [N, SAC_RE, SAC_RE, N]),  # compiled: a real region
    (("none", "op", "save", True, False), [N, HOOKS, HOOKS, N]),  # fsdp_ac_policy: only inside AC
    (("none", "op", "recompute", True, True), [N, SAC_RE, SAC_RE, N]),
    (("full", "op", "auto", False, False), [RegionSpec("full", None)] * 4),
    (
        ("full", "op", "auto", True, False),
        [RegionSpec("full", c) for c in ("save", "recompute", "recompute", "save")],
    ),
    (
        ("full", "op", "auto", True, True),
        [RegionSpec("full", c) for c in ("save", "recompute", "recompute", "save")],
    ),
    (("full", "op", "save", True, False), [RegionSpec("full", "save")] * 4),
    (("full", "op", "recompute", True, True), [RegionSpec("full", "recompute")] * 4),
    (("selective", "op", "auto", False, True), [RegionSpec("op", None)] * 4),
    (
        ("selective", "op", "auto", True, False),
        [RegionSpec("op", c) for c in ("save", "recompute", "recompute", "save")],
    ),
    (("selective", "op", "save", True, True), [RegionSpec("op", "save")] * 4),
    (("selective", "op", "recompute", True, False), [RegionSpec("op", "recompute")] * 4),
    (
        ("selective", "2", "auto", False, False),
        [RegionSpec("full", None), N, RegionSpec("full", None), N],
    ),
    (
        ("selective", "2", "auto", True, False),
        [RegionSpec("full", "save"), HOOKS, RegionSpec("full", "recompute"), N],
    ),
    (
        ("selective", "2", "auto", True, True),
        [RegionSpec("full", "save"), SAC_RE, RegionSpec("full", "recompute"), N],
    ),
    (
        ("selective", "2", "save", True, False),
        [RegionSpec("full", "save"), HOOKS, RegionSpec("full", "save"), N],
    ),
    (
        ("selective", "2", "recompute", True, True),
        [RegionSpec("full", "recompute"), SAC_RE, RegionSpec("full", "recompute"), N],
    ),
    (
        ("selective", "3", "auto", True, False),
        [RegionSpec("full", "save"), HOOKS, HOOKS, RegionSpec("full", "save")],
    ),
]


@pytest.mark.parametrize(
    "args, expected", SPECS_TABLE, ids=["-".join(map(str, a)) for a, _ in SPECS_TABLE]
)
def test_region_specs(args, expected):
    mode, option, policy, simple, compiled = args
    specs = region_specs(ac(mode, option, policy), BLOCKS, RESHARD, simple, compiled)
    assert list(specs) == BLOCKS  # in block order
    assert list(specs.values()) == expected


def test_region_specs_labels_and_wrapping_of_selective_every_second_block():
    specs = region_specs(ac("selective", "2"), BLOCKS, RESHARD, simple_fsdp=True)
    assert [(s.label, s.wrapped, s.by_hooks) for s in specs.values()] == [
        ("full AC, FSDP gathers saved", True, False),
        ("no AC, FSDP gathers recomputed", False, True),
        ("full AC, FSDP gathers recomputed", True, False),
        ("no AC", False, False),
    ]


def test_region_specs_count_positions_within_the_model_part():
    # a later pipeline stage's first block is position 0 of its part: checkpointed under "2"
    specs = region_specs(
        ac("selective", "2"), ["layers.5", "layers.6", "layers.7"], {}, simple_fsdp=False
    )
    assert [s.compute for s in specs.values()] == ["full", "none", "full"]


def test_region_specs_compiled_changes_only_by_hooks_of_blocks_without_ac():
    for mode, option in (("none", "op"), ("full", "op"), ("selective", "op"), ("selective", "2")):
        for policy in ("auto", "save", "recompute"):
            cfg = ac(mode, option, policy)
            eager = region_specs(cfg, BLOCKS, RESHARD, True, compiled=False)
            compiled = region_specs(cfg, BLOCKS, RESHARD, True, compiled=True)
            for name in BLOCKS:
                e, c = eager[name], compiled[name]
                assert (e.compute, e.fsdp_comm) == (c.compute, c.fsdp_comm)
                assert not c.by_hooks
                assert e.by_hooks == (e.compute == "none" and RESHARD.get(name, False)), (cfg, name)


def test_region_specs_of_no_blocks_is_empty():
    assert region_specs(ac("full"), [], {}, True, True) == {}
