"""Upstream's activation-checkpoint keys, compile.graph_passes and async TP: what reaches
torch.utils.checkpoint, op SAC's forced recomputes, the partitioner's memory budget, and the
pre-launch refusals (checks/compile_keys.py), line for line."""

import pytest
import torch
import torch._functorch.config as functorch_config
import torch.distributed.algorithms._checkpoint.checkpoint_wrapper as cw
from config_helpers import cfg_of
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, SelectiveCheckpointContext
from torch.utils.checkpoint import checkpoint as torch_checkpoint

from torchtitan.checks import compile_keys
from torchtitan.checks.compile_keys import check_compile_keys
from torchtitan.config import ConfigError
from torchtitan.config.job_config import ActivationCheckpoint
from torchtitan.distributed.activation_checkpoint import (
    CheckpointOptions,
    apply_ac,
    configure_checkpointing,
    forced_recompute_shapes,
    region_policy,
    region_specs,
)
from torchtitan.distributed.plan import RegionSpec

aten = torch.ops.aten
SAVE, RE = CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_RECOMPUTE


class Router(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(16, 4, bias=False)


class MoELike(nn.Module):
    def __init__(self):
        super().__init__()
        self.router = Router()
        self.proj = nn.Linear(16, 16, bias=False)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.moe = MoELike()

    def forward(self, x):
        scores = self.moe.router.gate(x).softmax(-1)
        return self.moe.proj(x).relu() * scores.sum(-1, keepdim=True)


class Model(nn.Module):
    def __init__(self, blocks=2):
        super().__init__()
        self.layers = nn.ModuleDict({str(i): Block() for i in range(blocks)})

    def forward(self, x):
        for block in self.layers.values():
            x = block(x)
        return x


@pytest.fixture(autouse=True)
def _restore_options():
    yield
    configure_checkpointing(ActivationCheckpoint(), "/tmp")  # torch's values, default options


def ac(**kwargs) -> ActivationCheckpoint:
    return ActivationCheckpoint(**kwargs)


# ------------------------------------------------------------------ forced-recompute shapes


@pytest.mark.parametrize("fqn", ["moe.router.gate", "router.gate", "layers.1.moe.router.gate"])
def test_forced_shapes_are_the_named_linears_in_out_shape(fqn):
    assert forced_recompute_shapes(Block(), "layers.1", [fqn]) == {(16, 4)}


@pytest.mark.parametrize("fqn", ["ter.gate", "moe.router", "layers.0.moe.router.gate"])
def test_forced_shapes_match_whole_name_suffixes_only(fqn):
    if fqn == "moe.router":  # names a module, but not a Linear
        with pytest.raises(ValueError) as info:
            forced_recompute_shapes(Block(), "layers.1", [fqn])
        assert str(info.value) == (
            "--activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns:"
            " layers.1.moe.router is a Router, not an nn.Linear; name Linear modules only"
        )
    else:
        assert forced_recompute_shapes(Block(), "layers.1", [fqn]) == frozenset()


def test_op_policy_recomputes_any_mm_of_a_forced_shape_and_saves_the_others():
    policy = region_policy(RegionSpec("op", None), frozenset(), forced_recompute={(16, 4)})
    ctx = SelectiveCheckpointContext(is_recompute=False)
    x = torch.zeros(8, 16)
    assert policy(ctx, aten.mm.default, x, torch.zeros(16, 4)) == RE  # the gate's, or any such
    assert policy(ctx, aten.mm.default, x, torch.zeros(16, 16)) == SAVE
    assert policy(ctx, aten.addmm.default, torch.zeros(4), x, torch.zeros(16, 4)) == SAVE
    full = region_policy(RegionSpec("full", None), frozenset(), forced_recompute={(16, 4)})
    assert full(ctx, aten.mm.default, x, torch.zeros(16, 16)) == RE  # full AC: unchanged


def test_op_sac_recomputes_the_router_gate_matmul_and_gradients_do_not_change(monkeypatch):
    """SAC asks the policy once per op of the real forward: the gate's mm (its weight operand
    (16, 4) as F.linear passes it) is recomputed, the projection's saved; gradients bitwise
    those of the run that saves both."""
    from torchtitan.distributed import activation_checkpoint as ac_module

    answers = []

    def spying(*args, **kwargs):
        policy = region_policy(*args, **kwargs)

        def spy(ctx, func, *a, **kw):
            decision = policy(ctx, func, *a, **kw)
            if func == aten.mm.default:
                answers.append((tuple(a[1].shape), decision))
            return decision

        return spy

    monkeypatch.setattr(ac_module, "region_policy", spying)
    x = torch.randn(8, 16)
    grads = {}
    for fqns in ([], ["moe.router.gate"]):
        answers.clear()
        configure_checkpointing(ac(per_op_sac_force_recompute_mm_shapes_by_fqns=fqns), "/tmp")
        torch.manual_seed(0)
        model = Model()
        apply_ac(model, {f"layers.{i}": RegionSpec("op", None) for i in range(2)}, frozenset())
        model(x).sum().backward()
        grads[len(fqns)] = [p.grad for p in model.parameters()]
        gate = RE if fqns else SAVE
        assert answers == [((16, 4), gate), ((16, 16), SAVE)] * 2, answers
    assert all(torch.equal(a, b) for a, b in zip(grads[0], grads[1]))


# ------------------------------------------------------------------ torch.utils.checkpoint's kwargs


@pytest.mark.parametrize("compute", ["full", "op"])
def test_the_keys_reach_torch_checkpoint(monkeypatch, compute):
    seen = []

    def recording(fn, *args, **kwargs):
        seen.append({k: v for k, v in kwargs.items() if k != "context_fn"})
        return torch_checkpoint(fn, *args, **kwargs)

    monkeypatch.setattr(cw, "torch_utils_checkpoint", recording)
    cfg = ac(preserve_rng_state=True, determinism_check="none", early_stop=True, debug=False)
    configure_checkpointing(cfg, "/tmp")
    model = Model()
    apply_ac(model, {f"layers.{i}": RegionSpec(compute, None) for i in range(2)}, frozenset())
    model(torch.randn(4, 16)).sum().backward()
    expected = {
        "use_reentrant": False,
        "preserve_rng_state": True,
        "determinism_check": "none",
        "debug": False,
        "early_stop": True,
    }
    assert seen == [expected, expected]


def test_the_defaults_keep_no_rng_state_and_no_early_stop():
    assert CheckpointOptions.of(ActivationCheckpoint()).checkpoint_kwargs() == {
        "preserve_rng_state": False,
        "determinism_check": "default",
        "debug": False,
        "early_stop": False,
    }


def test_torch_debug_mode_refuses_a_selective_region():
    """The reason checks/compile_keys.py refuses debug outside plain full AC."""
    configure_checkpointing(ac(debug=True), "/tmp")
    model = Model(1)
    apply_ac(model, {"layers.0": RegionSpec("op", None)}, frozenset())
    with pytest.raises(ValueError, match="debug=True is incompatible with non-default context_fn"):
        model(torch.randn(4, 16))
    full = Model(1)
    apply_ac(full, {"layers.0": RegionSpec("full", None)}, frozenset())
    full(torch.randn(4, 16)).sum().backward()  # plain full AC runs in debug mode


# ------------------------------------------------------------------ mode=memory_budget


def test_memory_budget_mode_builds_no_region_and_sets_the_partitioner():
    specs = region_specs(ac(mode="memory_budget"), ["layers.0", "layers.1"], {}, False, True)
    assert [s.wrapped for s in specs.values()] == [False, False]
    configure_checkpointing(
        ac(mode="memory_budget", memory_budget=0.3, visualize_memory_budget_pareto=True), "/d"
    )
    assert functorch_config.activation_memory_budget == 0.3
    assert functorch_config.visualize_memory_budget_pareto is True
    assert functorch_config.memory_budget_pareto_dir == "/d/memory_budget_pareto"
    configure_checkpointing(ac(mode="full"), "/d")  # a later job in the process
    assert functorch_config.activation_memory_budget == 1.0
    assert functorch_config.visualize_memory_budget_pareto is False


# ------------------------------------------------------------------ pre-launch refusals


def refusal(argv) -> str:
    with pytest.raises(ConfigError) as info:
        check_compile_keys(cfg_of(argv))
    return str(info.value)


COMPILE = ["--compile.enable=true"]
SIMPLE = "--parallelism.fsdp_implementation=simple_fsdp"


@pytest.mark.parametrize(
    "argv, line",
    [
        (
            ["--activation_checkpoint.mode=memory_budget"],
            "--activation_checkpoint.mode=memory_budget: the compiler's partitioner chooses what"
            " to recompute, so the blocks must be compiled: set --compile.enable=true with"
            ' "model" in --compile.components',
        ),
        (
            ["--activation_checkpoint.mode=memory_budget", *COMPILE, "--compile.components=loss"],
            "--activation_checkpoint.mode=memory_budget: the compiler's partitioner chooses what"
            " to recompute, so the blocks must be compiled: set --compile.enable=true with"
            ' "model" in --compile.components',
        ),
        (
            ["--activation_checkpoint.memory_budget=1.5"],
            "--activation_checkpoint.memory_budget=1.5: must be between 0 (recompute everything)"
            " and 1 (the partitioner's default choice)",
        ),
        (
            ["--activation_checkpoint.visualize_memory_budget_pareto=true"],
            "--activation_checkpoint.visualize_memory_budget_pareto=true: only with"
            " --activation_checkpoint.mode=memory_budget (the curve is the partitioner's)",
        ),
        (
            ["--activation_checkpoint.determinism_check=strict"],
            "--activation_checkpoint.determinism_check='strict': use one of default, none",
        ),
        (
            ["--activation_checkpoint.mode=selective", "--activation_checkpoint.debug=true"],
            "--activation_checkpoint.debug=true: torch's checkpoint debug mode runs only in"
            " regions without a selective policy: use --activation_checkpoint.mode=full (or"
            " selective with an integer selective_ac_option) with"
            " --parallelism.fsdp_implementation=fsdp2 and --compile.enable=false",
        ),
        (
            ["--compile.graph_passes=transformer_block_bucketing", *COMPILE],
            "--compile.graph_passes=transformer_block_bucketing: a SimpleFSDP + compile pass:"
            " set --parallelism.fsdp_implementation=simple_fsdp and --compile.enable=true with"
            ' "model" in --compile.components',
        ),
        (
            ["--compile.graph_passes=auto_bucketing", SIMPLE],
            "--compile.graph_passes=auto_bucketing: a SimpleFSDP + compile pass: set"
            " --parallelism.fsdp_implementation=simple_fsdp and --compile.enable=true with"
            ' "model" in --compile.components',
        ),
        (
            ["--compile.graph_passes=auto_bucketing", SIMPLE, *COMPILE],
            "--compile.graph_passes=auto_bucketing: nothing for inductor to bucket here:"
            " SimpleFSDP gathers each FSDP unit with one all-gather inside an opaque op and each"
            " block compiles as its own graph; use transformer_block_bucketing (one bucket per"
            " block, the layout it runs) or leave the key empty",
        ),
        (
            ["--parallelism.enable_async_tensor_parallel=true", "--training.device=cpu"],
            "--parallelism.enable_async_tensor_parallel=true: not on CPU: torch's micro-pipeline"
            " TP runs over symmetric memory, which is CUDA-only; set it to false",
        ),
    ],
)
def test_refusals(argv, line):
    assert refusal(argv) == line


@pytest.mark.parametrize(
    "argv",
    [
        ["--activation_checkpoint.mode=memory_budget", *COMPILE],
        ["--activation_checkpoint.mode=full", "--activation_checkpoint.debug=true"],
        [
            "--activation_checkpoint.mode=selective",
            "--activation_checkpoint.selective_ac_option=2",
            "--activation_checkpoint.debug=true",
        ],
        ["--compile.graph_passes=transformer_block_bucketing", SIMPLE, *COMPILE],
        ["--activation_checkpoint.determinism_check=none"],
    ],
)
def test_accepted(argv):
    check_compile_keys(cfg_of(argv))


def test_async_tp_on_cuda_needs_model_compile_and_tp(monkeypatch):
    monkeypatch.setattr(compile_keys.hardware, "gpu_names", lambda: ["NVIDIA H100 80GB HBM3"])
    on = "--parallelism.enable_async_tensor_parallel=true"
    assert refusal([on]) == (
        "--parallelism.enable_async_tensor_parallel=true: async TP is a compiler pass: set"
        ' --compile.enable=true with "model" in --compile.components'
    )
    assert refusal([on, *COMPILE]) == (
        "--parallelism.enable_async_tensor_parallel=true: needs"
        " --parallelism.tensor_parallel_degree > 1 (there are no TP collectives to overlap)"
    )
    check_compile_keys(cfg_of([on, *COMPILE, "--parallelism.tensor_parallel_degree=2"]))
    monkeypatch.setattr(compile_keys.hardware, "gpu_names", lambda: [])  # auto, no GPU: CPU
    assert "not on CPU" in refusal([on, *COMPILE, "--parallelism.tensor_parallel_degree=2"])


# ------------------------------------------------------------------ torchtitan's own op SAC (every 2nd mm)


def test_op_policy_recomputes_every_nth_mm_of_a_call_counting_after_the_forced_ones():
    policy = region_policy(
        RegionSpec("op", None), frozenset(), forced_recompute={(16, 4)}, every_nth_mm=2
    )
    ctx = SelectiveCheckpointContext(is_recompute=False)
    x, w, gate = torch.zeros(8, 16), torch.zeros(16, 16), torch.zeros(16, 4)
    got = [policy(ctx, aten.mm.default, x, b) for b in (w, gate, w, w, w)]
    assert got == [SAVE, RE, RE, SAVE, RE]  # the gate forced; of the others the 2nd and 4th
    fresh = region_policy(RegionSpec("op", None), frozenset(), every_nth_mm=2)
    assert fresh(ctx, aten.mm.default, x, w) == SAVE  # the count is per region call
    assert policy(ctx, aten.addmm.default, torch.zeros(16), x, w) == SAVE  # mm only, as upstream


def test_every_2nd_mm_recomputes_half_the_matmuls_and_gradients_do_not_change():
    """A real backward: with n = 2 backward runs one more forward mm per block (the second of
    its two), and the gradients are bitwise those of saving every mm."""
    x = torch.randn(8, 16)
    grads, backward_mms = {}, {}
    for nth in (0, 2):
        configure_checkpointing(
            ac(
                per_op_sac_recompute_every_nth_mm=nth,
                per_op_sac_force_recompute_mm_shapes_by_fqns=[],
            ),
            "/tmp",
        )
        torch.manual_seed(0)
        model = Model()
        apply_ac(model, {f"layers.{i}": RegionSpec("op", None) for i in range(2)}, frozenset())
        loss = model(x).sum()
        with _MmCounter() as counter:
            loss.backward()
        backward_mms[nth] = counter.mm
        grads[nth] = [p.grad for p in model.parameters()]
    assert backward_mms[2] == backward_mms[0] + 2  # one recomputed mm in each of 2 blocks
    assert all(torch.equal(a, b) for a, b in zip(grads[0], grads[2]))


class _MmCounter(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.mm = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func == aten.mm.default:
            self.mm += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("nth", [1, -2])
def test_every_nth_mm_of_one_or_less_is_refused_in_one_line(nth):
    from torchtitan.checks.layout import check_activation_checkpoint

    with pytest.raises(ConfigError) as e:
        check_activation_checkpoint(
            cfg_of([f"--activation_checkpoint.per_op_sac_recompute_every_nth_mm={nth}"])
        )
    assert str(e.value) == (
        f"--activation_checkpoint.per_op_sac_recompute_every_nth_mm={nth}: use 0 (save every"
        " matmul) or n >= 2 (recompute every n-th; 2 is torchtitan's op SAC); to recompute"
        " every matmul use --activation_checkpoint.mode=full"
    )
