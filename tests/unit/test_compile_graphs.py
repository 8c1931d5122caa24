"""Every block of Llama3, DeepSeek-V3 (dense, MoE, MTP) and Qwen3 (dense, MoE) compiles with
fullgraph=True under every activation-checkpoint mode: one graph per block kind, no graph
break, no recompile after a block's first call while the routing changes from step to step,
and the compiled model computes what the eager one does, bit for bit (aot_eager: the same
kernels), tokens per expert and balance losses included. No process group: the layouts
with one (EP, TP, CP, SimpleFSDP) are tests/integration/test_compile_graphs_run.py.

Also the pieces: `torchtitan::grouped_mm` against `torch._grouped_mm` (forward, backward,
torch.library.opcheck), and the partitioner fix of torchtitan/distributed/compile.py."""

import dataclasses
import operator

import pytest
import torch
import torch.nn.functional as F

from torchtitan.config.job_config import ActivationCheckpoint, Compile
from torchtitan.distributed.activation_checkpoint import apply_ac, region_specs
from torchtitan.distributed.compile import (
    _fix_rng_state_order,
    apply_compile,
    compile_log_lines,
    compile_stats,
    reset_compile_stats,
)
from torchtitan.distributed.expert_parallel import SAC_SAVE_OPS
from torchtitan.models.common.grouped_mm import _grouped_mm_op, grouped_mm
from torchtitan.models.common.moe import moe_aux_loss, moe_modules, update_expert_bias

VOCAB, SEQ, BATCH = 128, 32, 2
STEPS = 3

AC_MODES = {
    "none": ActivationCheckpoint(mode="none"),
    "full": ActivationCheckpoint(mode="full"),
    "op": ActivationCheckpoint(mode="selective", selective_ac_option="op"),
    "every2": ActivationCheckpoint(mode="selective", selective_ac_option="2"),
}


def build(kind: str, seed: int = 0) -> torch.nn.Module:
    """The tiny flavors: llama3 (4 dense blocks), deepseek_v3 (1 dense + 3 MoE blocks and one
    MoE MTP module, sequence-wise balance loss on), qwen3 tiny_moe (1 dense + 3 MoE blocks,
    Switch balance loss)."""
    if kind == "llama3":
        from torchtitan.models.llama3.args import FLAVORS
        from torchtitan.models.llama3.model import Transformer

        args = dataclasses.replace(FLAVORS["tiny"], vocab_size=VOCAB, max_seq_len=SEQ)
    elif kind == "deepseek_v3":
        from torchtitan.models.deepseek_v3.args import FLAVORS
        from torchtitan.models.deepseek_v3.model import Transformer

        args = dataclasses.replace(
            FLAVORS["tiny"], vocab_size=VOCAB, max_seq_len=SEQ, mtp_depth=1, aux_loss_coeff=1e-3
        )
    else:
        from torchtitan.models.qwen3.args import FLAVORS
        from torchtitan.models.qwen3.model import Transformer

        args = dataclasses.replace(FLAVORS["tiny_moe"], vocab_size=VOCAB, max_seq_len=SEQ)
    model = Transformer(args)
    model.init_weights(seed, "cpu")
    return model


def parallelize(
    model: torch.nn.Module,
    ac: ActivationCheckpoint,
    backend: str | None,
    hooked: frozenset[str] = frozenset(),
) -> None:
    """What parallelize_decoder does on one rank: AC regions (the trainer's specs), then
    compile every block ModuleDict (backend None: eager). `hooked`: blocks treated as holding
    an FSDP2 unit (their dispatch outside the graph)."""
    dicts = [d for d in ("layers", "mtp") if getattr(model, d, None) is not None]
    names = [f"{d}.{k}" for d in dicts for k in getattr(model, d)]
    moe = bool(moe_modules(model))
    apply_ac(
        model,
        region_specs(ac, names, {}, False, compiled=backend is not None),
        frozenset(),
        extra_save_ops=SAC_SAVE_OPS if moe else (),
    )
    if backend is not None:
        for block in hooked:
            for layer in moe_modules(model.get_submodule(block)):
                layer.dispatch_in_graph = False
        for d in dicts:
            apply_compile(
                getattr(model, d), Compile(enable=True, backend=backend), name=d, hooked=hooked
            )


def batch(step: int):
    g = torch.Generator().manual_seed(100 + step)  # other tokens every step: other routing
    return (
        torch.randint(0, VOCAB, (BATCH, SEQ), generator=g),
        torch.randint(0, VOCAB, (BATCH, 1, SEQ), generator=g),
        torch.randn(BATCH, 2 * SEQ, VOCAB, generator=g),
    )


def train_step(model, step: int) -> dict:
    """Forward (MTP tokens too for DeepSeek-V3), a loss with a dense upstream gradient plus
    the balance loss, backward; then the trainer's bias update. Returns what must match."""
    tokens, mtp_tokens, weight = batch(step)
    logits = (
        model(tokens, mtp_tokens=mtp_tokens)
        if getattr(model, "mtp", None) is not None
        else model(tokens)
    )
    loss = (logits * weight[:, : logits.shape[1]]).sum() / logits.numel()
    aux = moe_aux_loss(model)
    if aux is not None:
        loss = loss + aux
    loss.backward()
    moes = moe_modules(model)
    counts = [m.tokens_per_expert.clone() for m in moes]
    for m in moes:  # moves the selection bias: the next step routes differently again
        update_expert_bias(m, m.tokens_per_expert, 1e-2)
    out = {
        "logits": logits.detach(),
        "loss": loss.detach(),
        "counts": counts,
        "aux": None if aux is None else aux.detach(),
    }
    return out


def grads(model) -> dict:
    return {
        n.replace("_orig_mod.", "").replace("_checkpoint_wrapped_module.", ""): p.grad.clone()
        for n, p in model.named_parameters()
    }


def assert_same(a, b, what: str, atol: float = 0.0) -> None:
    if atol == 0.0:
        assert torch.equal(a, b), f"{what}: max |diff| {(a - b).abs().max().item()}"
    else:
        torch.testing.assert_close(a, b, rtol=0, atol=atol, msg=what)


def run_pair(
    kind: str, ac: str, backend: str, atol: float = 0.0, hooked: frozenset[str] = frozenset()
) -> dict:
    """Eager and compiled copies of one model, STEPS steps each on the same batches: every
    step's figures and the accumulated gradients must match; returns compile_stats()."""
    torch._dynamo.reset()
    reset_compile_stats()
    eager, compiled = build(kind), build(kind)
    parallelize(eager, AC_MODES[ac], None)
    parallelize(compiled, AC_MODES[ac], backend, hooked)
    for step in range(STEPS):
        want, got = train_step(eager, step), train_step(compiled, step)
        assert_same(want["logits"], got["logits"], f"step {step} logits", atol)
        assert_same(want["loss"], got["loss"], f"step {step} loss", atol)
        assert len(want["counts"]) == len(got["counts"])
        for i, (w, g) in enumerate(zip(want["counts"], got["counts"])):
            # integers: the same routing, and every token copy counted once (not again by a
            # recompute): the bias update of the next step depends on them
            assert torch.equal(w, g), (
                f"step {step} MoE {i} tokens_per_expert {w.tolist()} != {g.tolist()}"
            )
            assert int(g.sum()) == BATCH * SEQ * moe_modules(compiled)[i].top_k
        if want["aux"] is not None:
            assert_same(want["aux"], got["aux"], f"step {step} balance loss", atol)
    gw, gc = grads(eager), grads(compiled)
    assert gw.keys() == gc.keys()
    for name in gw:
        assert_same(gw[name], gc[name], f"grad {name}", atol)
    return compile_stats()


# block kinds (one graph each): llama3 one block; deepseek_v3 dense, MoE, MTP; qwen3 dense,
# MoE. Every 2nd block checkpointed: the checkpointed and the plain variant of a kind are
# two graphs (DeepSeek-V3: dense full, MoE plain, MoE full; mtp.0 is position 4: full).
KINDS = {
    "llama3": {"none": 1, "full": 1, "op": 1, "every2": 2},
    "deepseek_v3": {"none": 3, "full": 3, "op": 3, "every2": 4},
    "qwen3": {"none": 2, "full": 2, "op": 2, "every2": 3},
}
# (make test) one case per model; the rest: `pytest -m slow`
FAST = {("llama3", "full"), ("deepseek_v3", "op"), ("qwen3", "full")}


@pytest.mark.parametrize(
    "kind,ac",
    [
        (k, a) if (k, a) in FAST else pytest.param(k, a, marks=pytest.mark.slow)
        for k in KINDS
        for a in AC_MODES
    ],
)
def test_blocks_compile_fullgraph_once_and_match_eager(kind, ac):
    stats = run_pair(kind, ac, "aot_eager")
    assert stats["graph_breaks"] == 0
    assert stats["graphs"] == KINDS[kind][ac] == stats["compiles"], stats
    assert stats["late_compiles"] == 0, stats["events"]  # nothing recompiled from step 2 on
    # each compile is charged to the first block of its kind
    compiled_blocks = {b for b, v in stats["blocks"].items() if v["compiles"]}
    assert len(compiled_blocks) == KINDS[kind][ac] and "layers.0" in compiled_blocks
    lines = compile_log_lines()
    assert (
        len(lines) == 1
        and f"{KINDS[kind][ac]} graph(s), 0 graph break(s), 0 recompile(s)" in lines[0]
    )


@pytest.mark.slow
def test_moe_blocks_under_inductor_match_eager():
    """Inductor (C++ codegen: ~1 min per MoE block kind here). Measured on CPU: bitwise equal;
    the bound allows inductor's fused reductions to round differently."""
    stats = run_pair("qwen3", "op", "inductor", atol=1e-5)
    assert stats["graph_breaks"] == 0 and stats["graphs"] == 2 and stats["late_compiles"] == 0


@pytest.mark.parametrize("ac", ["none", pytest.param("op", marks=pytest.mark.slow)])
def test_blocks_holding_an_fsdp2_unit_break_once_at_the_dispatch(ac):
    """The fallback for MoE blocks whose experts FSDP2 / DDP wrap (hooks dynamo cannot
    trace): compiled with fullgraph=False, the dispatch outside the graph. Every break is
    that one call, nothing recompiles, and the numbers are eager's."""
    moe_blocks = frozenset({"layers.1", "layers.2", "layers.3"})
    stats = run_pair("qwen3", ac, "aot_eager", hooked=moe_blocks)
    assert stats["not_fullgraph"] == sorted(moe_blocks)
    assert stats["graph_breaks"] > 0 and all(
        "_dispatch_outside_graph" in r for r in stats["break_reasons"]
    )
    assert stats["late_compiles"] == 0, stats["events"]
    assert stats["blocks"]["layers.0"]["compiles"] == 1  # the dense block: whole


def test_hooked_blocks_are_those_holding_an_fsdp2_or_ddp_unit():
    from torchtitan.distributed.plan import FsdpUnit, PartPlan, UnitKind
    from torchtitan.models.common.parallelize import hooked_blocks

    units = (
        FsdpUnit("tok_embeddings"),
        FsdpUnit("layers.0", block="layers.0"),
        FsdpUnit("layers.1", block="layers.1"),
        FsdpUnit("layers.1.moe.experts", block="layers.1", kind=UnitKind.EXPERTS),
        FsdpUnit(""),
    )
    plan = PartPlan(0, units)
    assert hooked_blocks(plan, "fsdp2") == {"layers.1"}
    assert (
        hooked_blocks(PartPlan(0, units[:3] + units[4:]), "fsdp2") == frozenset()
    )  # dense: nothing nested
    # SimpleFSDP: whole blocks (its unit input traces); under PP (units gathered once per
    # step, eager state) the nested unit keeps its break
    assert hooked_blocks(plan, "simple_fsdp") == frozenset()
    assert hooked_blocks(PartPlan(0, units, microbatches=4), "simple_fsdp") == {"layers.1"}


# --------------------------------------------------------------------------- the grouped GEMM operator


def _aten_reference(x, w, offs):
    return torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_mm_equals_torch_grouped_mm_forward_and_backward(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(10, 8, generator=g).to(dtype).requires_grad_()
    w = torch.randn(4, 16, 8, generator=g).to(dtype).requires_grad_()
    offs = torch.tensor([3, 3, 8, 10], dtype=torch.int32)  # group 1 empty
    dy = torch.randn(10, 16, generator=g).to(dtype)
    y = grouped_mm(x, w, offs)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    y_ref = _aten_reference(x, w, offs)
    dx_ref, dw_ref = torch.autograd.grad(y_ref, (x, w), dy)
    for a, b in ((y, y_ref), (dx, dx_ref), (dw, dw_ref)):
        assert a.dtype == dtype and torch.equal(a, b)
    assert (dw[1] == 0).all()  # the empty group's weight gets a zero gradient
    # a stride-0 incoming gradient (y.sum().backward()) works: aten's own backward rejects it
    x.grad = w.grad = None
    grouped_mm(x, w, offs).sum().backward()
    assert torch.equal(
        x.grad, torch.autograd.grad(_aten_reference(x, w, offs), x, torch.ones_like(y_ref))[0]
    )


def test_grouped_mm_fake_and_autograd_registrations_pass_opcheck():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 4, generator=g, requires_grad=True)
    w = torch.randn(3, 8, 4, generator=g, requires_grad=True)
    offs = torch.tensor([1, 4, 6], dtype=torch.int32)
    torch.library.opcheck(_grouped_mm_op, (x, w, offs))
    # the fake implementation traces float32, where aten's meta kernel refuses
    with torch._subclasses.FakeTensorMode() as mode:
        fx, fw, fo = mode.from_tensor(x), mode.from_tensor(w), mode.from_tensor(offs)
        assert grouped_mm(fx, fw, fo).shape == (6, 8)
        from torch._subclasses import fake_impls

        if (
            torch.ops.aten._grouped_mm.default not in fake_impls.op_implementations_dict
        ):  # (the memory simulation's patch)
            with pytest.raises(RuntimeError, match="BF16"):
                _aten_reference(fx, fw, fo)


def test_grouped_mm_compiles_fullgraph_in_float32():
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(2)
    x = torch.randn(12, 8, generator=g, requires_grad=True)
    w = torch.randn(4, 16, 8, generator=g, requires_grad=True)

    def f(x, w, counts):
        return F.silu(grouped_mm(x, w, torch.cumsum(counts, 0).to(torch.int32)))

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    for counts in ([3, 0, 5, 4], [12, 0, 0, 0], [1, 2, 3, 6]):  # new routing: the same graph
        c = torch.tensor(counts)
        y, y_ref = compiled(x, w, c), f(x, w, c)
        assert torch.equal(y, y_ref)
        d = torch.autograd.grad(y, (x, w), torch.ones_like(y))
        d_ref = torch.autograd.grad(y_ref, (x, w), torch.ones_like(y_ref))
        assert all(torch.equal(a, b) for a, b in zip(d, d_ref))


# --------------------------------------------------------------------------- the partitioner fix


def _graphs(no_vc_check: bool):
    """A forward/backward pair as torch 2.13's functionalize_rng_ops leaves it: forward
    outputs (out, saved a, saved b [tensor kept without version check], random state),
    backward inputs (a, b, random state, tangent)."""
    fw = torch.fx.Graph()
    x = fw.placeholder("x")
    a = fw.call_function(torch.ops.aten.relu.default, (x,))
    b = fw.call_function(torch.ops.aten.neg.default, (x,))
    b.meta["saved_tensor_with_no_vc_check"] = no_vc_check
    run = fw.call_function(
        torch._prims.rng_prims.run_and_save_rng_state, (torch.ops.aten.rand.default, [2])
    )
    state = fw.call_function(operator.getitem, (run, 0))
    out = fw.call_function(
        torch.ops.aten.add.Tensor, (a, fw.call_function(operator.getitem, (run, 1)))
    )
    fw.output((out, a, b, state))
    bw = torch.fx.Graph()
    ba, bb, bs = (
        bw.placeholder(a.name),
        bw.placeholder(b.name),
        bw.placeholder("rng_state_output_0"),
    )
    t = bw.placeholder("tangents_1")
    bw.output(
        (
            bw.call_function(
                torch.ops.aten.add.Tensor,
                (bw.call_function(torch.ops.aten.mul.Tensor, (t, ba)), bb),
            ),
        )
    )
    del bs
    return torch.fx.GraphModule({}, fw), torch.fx.GraphModule({}, bw), a.name, b.name


def test_partitioner_fix_moves_random_states_before_trailing_saved_values():
    fw, bw, a, b = _graphs(no_vc_check=True)
    assert _fix_rng_state_order(fw, bw)
    outs = [n.name for n in next(iter(fw.graph.find_nodes(op="output"))).args[0]]
    ins = [n.name for n in bw.graph.find_nodes(op="placeholder")]
    assert (
        outs[0].startswith("add") and outs[1:] == [a, outs[2], b] and outs[2].startswith("getitem")
    )
    assert ins == [a, "rng_state_output_0", b, "tangents_1"]  # the same order on both sides
    fw.recompile(), bw.recompile()  # still valid graphs

    fw, bw, a, b = _graphs(no_vc_check=False)  # nothing trails the checked tensors: left alone
    assert not _fix_rng_state_order(fw, bw)
    assert [n.name for n in bw.graph.find_nodes(op="placeholder")] == [
        a,
        b,
        "rng_state_output_0",
        "tangents_1",
    ]
