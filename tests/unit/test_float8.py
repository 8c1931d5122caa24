"""Float8 training (models/common/float8.py, checks/quantize.py): the conversion on meta and
what it keeps in high precision, the float8 GEMMs a step runs per recipe on CPU, the tensor
parallel styles chosen, and every bad input's one line. The layouts' parity and the float8
all-gather's bytes are tests/integration/test_float8_runs.py and the parity suite."""

import pytest
import torch
from config_helpers import cfg_of, config_error
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from torchtitan import hardware
from torchtitan.checks import quantize as quantize_checks
from torchtitan.config.quantize_sections import converter_names
from torchtitan.models.common.float8 import (
    convert_model,
    float8_tp_styles,
    is_float8_linear,
    precompute_scales_on,
)
from torchtitan.training.planned_job import model_on_meta

F8 = ["--model.converters=quantize.linear.float8"]
KEY = "--quantize.linear.float8"


def _converted(argv: list[str]) -> tuple[nn.Module, list[str]]:
    model = model_on_meta(cfg_of(argv)).model
    return model, [n for n, m in model.named_modules() if is_float8_linear(m)]


def test_upstream_spelling_is_the_float8_linear_converter():
    assert converter_names(["float8", "quantize.linear.float8", "mx"]) == [
        "quantize.linear.float8",
        "quantize.linear.float8",
        "quantize.linear.mx",
    ]


def test_every_block_linear_is_converted_the_filtered_output_is_not():
    model, converted = _converted(
        ["--model.flavor=tiny", "--model.converters=float8", f"{KEY}.filter_fqns=output"]
    )
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    assert "output" in linears and "output" not in converted
    assert sorted(converted) == sorted(n for n in linears if n != "output")
    assert len(converted) == 4 * 7  # 4 blocks x (wq, wk, wv, wo, w1, w2, w3)
    # weights stay high-precision parameters (their state dict is a Linear's)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert set(model.state_dict()) == set(
        model_on_meta(cfg_of(["--model.flavor=tiny"])).model.state_dict()
    )


def test_a_tied_output_head_is_never_converted():
    model, converted = _converted(["--model.name=qwen3", "--model.flavor=tiny", *F8])
    assert model.output.weight is model.tok_embeddings.weight  # tiny Qwen3 ties them
    assert "output" not in converted and len(converted) == 4 * 7


def test_auto_filter_keeps_layers_too_small_to_gain():
    # the debug model's block linears are all below torchao's tensorwise thresholds (K <= 4096
    # and N <= 1024 is filtered; its output head, N = the 2,048-token vocabulary, is not);
    # of llama3 8B's, all but wk and wv (N = 8 kv heads x 128 = 1024, K = 4096)
    _, converted = _converted(
        ["--model.flavor=debugmodel", *F8, f"{KEY}.filter_fqns=auto_filter_small_kn"]
    )
    assert converted == ["output"]
    _, converted = _converted(
        ["--model.flavor=8B", *F8, f"{KEY}.filter_fqns=output,auto_filter_small_kn"]
    )
    assert len(converted) == 32 * 5
    assert not [n for n in converted if n.endswith((".wk", ".wv"))]


@pytest.mark.parametrize(
    "argv",
    [
        ["--model.flavor=8B", f"{KEY}.filter_fqns=output,auto_filter_small_kn"],
        ["--model.flavor=debugmodel", f"{KEY}.filter_fqns=auto_filter_small_kn"],
        ["--model.flavor=tiny", f"{KEY}.filter_fqns=wq,output"],
        ["--model.name=qwen3", "--model.flavor=tiny"],  # its output head tied
        ["--model.name=deepseek_v3", "--model.flavor=debugmodel", f"{KEY}.filter_fqns=router"],
    ],
)
def test_the_shapes_name_the_weights_the_conversion_converts(argv):
    """converted_weights (the layout search prices float8 GEMMs by it) from the model's
    shapes alone equals what convert_model converts on the model built on meta."""
    from torchtitan.models.common.float8 import converted_weights
    from torchtitan.planning.memory.model_states import model_shapes

    cfg = cfg_of([*argv, *F8])
    meta = model_on_meta(cfg)
    _, converted = _converted([*argv, *F8])
    shapes = model_shapes(cfg.model.name, meta.args)
    got = converted_weights(shapes.all(), cfg.quantize.linear.float8, shapes.tied)
    assert got == {f"{n}.weight" for n in converted}


def test_nothing_is_converted_without_the_converter():
    assert (
        convert_model(nn.Sequential(nn.Linear(16, 16)), [], cfg_of([]).quantize.linear.float8) == []
    )


class _CountScaledMM(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.scaled, self.mm = 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(t is not torch.Tensor for t in types):
            return NotImplemented  # torchao's float8 tensor first: count what it lowers to
        if func is torch.ops.aten._scaled_mm.default:
            self.scaled += 1
        elif func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
            self.mm += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    "recipe, scaled, mm",
    [("tensorwise", 3, 0), ("rowwise", 3, 0), ("rowwise_with_gw_hp", 2, 1)],
)
def test_float8_gemms_per_linear_and_step_on_cpu(recipe, scaled, mm):
    """Real `torch._scaled_mm` on CPU (no emulation): output, input gradient and weight gradient
    in float8; rowwise_with_gw_hp keeps the weight gradient a high-precision mm."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128, bias=False), nn.Linear(128, 32, bias=False))
    section = cfg_of([*F8, f"{KEY}.recipe_name={recipe}"]).quantize.linear.float8
    assert convert_model(model, F8[0].split("=")[1:], section) == ["0", "1"]
    x = torch.randn(16, 64, requires_grad=True)
    with _CountScaledMM() as count:
        model(x).sum().backward()
    assert (count.scaled, count.mm) == (2 * scaled, 2 * mm)
    ref = nn.Sequential(nn.Linear(64, 128, bias=False), nn.Linear(128, 32, bias=False))
    ref.load_state_dict(model.state_dict())  # a Float8Linear's state is a Linear's
    rel = (model(x) - ref(x)).norm() / ref(x).norm()
    assert 0 < rel < 0.1  # float8 rounding: a few percent, never exact


def test_tp_styles_are_float8_only_for_a_group_of_tensorwise_float8_linears():
    def group(recipe):
        m = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 32))
        convert_model(
            m, ["float8"], cfg_of([*F8, f"{KEY}.recipe_name={recipe}"]).quantize.linear.float8
        )
        return list(m)

    assert float8_tp_styles(group("tensorwise")).float8
    assert not float8_tp_styles(group("rowwise")).float8  # torchao's TP styles are tensorwise
    assert not float8_tp_styles([*group("tensorwise"), nn.Linear(32, 32)]).float8
    assert not float8_tp_styles([nn.Linear(32, 32)]).float8


def test_scales_are_precomputed_only_with_the_all_gather_and_sharding():
    on = cfg_of(
        [
            *F8,
            f"{KEY}.enable_fsdp_float8_all_gather=true",
            f"{KEY}.precompute_float8_dynamic_scale_for_fsdp=true",
        ]
    )
    f8 = on.quantize.linear.float8
    assert precompute_scales_on(f8, on.model.converters, dp_shard=2)
    assert not precompute_scales_on(f8, on.model.converters, dp_shard=1)
    assert not precompute_scales_on(f8, [], dp_shard=2)
    off = cfg_of([*F8, f"{KEY}.precompute_float8_dynamic_scale_for_fsdp=true"])
    assert not precompute_scales_on(off.quantize.linear.float8, off.model.converters, dp_shard=2)


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "argv, world, expected",
    [
        (
            ["--model.converters=float16"],
            1,
            "--model.converters=float16: unknown converter 'float16'; choose from quantize.linear.float8,",
        ),
        (
            ["--model.converters=quantize.linear.mx"],
            1,
            "--model.converters=quantize.linear.mx: MX (microscaling) training is not in this fork",
        ),
        (
            ["--model.name=deepseek_v3", "--model.converters=float8,quantize.grouped_mm.float8"],
            1,
            "--model.converters=float8,quantize.grouped_mm.float8: float8 routed experts are refused"
            " on CPU: torch has no float8 grouped GEMM kernel (`_scaled_grouped_mm`) there;",
        ),
        (
            ["--model.converters=float8,quantize.linear.float8"],
            1,
            "--model.converters=float8,quantize.linear.float8: a converter is named twice",
        ),
        (
            [*F8, f"{KEY}.enable_fsdp_float8_all_gather=true", f"{KEY}.recipe_name=rowwise"],
            2,
            f"{KEY}.enable_fsdp_float8_all_gather with recipe_name=rowwise: the float8 all-gather"
            " casts each weight with one tensorwise scale;",
        ),
        (
            [
                *F8,
                f"{KEY}.enable_fsdp_float8_all_gather=true",
                "--parallelism.fsdp_implementation=simple_fsdp",
            ],
            2,
            f"{KEY}.enable_fsdp_float8_all_gather with fsdp_implementation=simple_fsdp: SimpleFSDP's"
            " all-gather is not float8-aware",
        ),
        (
            [
                *F8,
                f"{KEY}.recipe_name=rowwise_with_gw_hp",
                f"{KEY}.filter_fqns=auto_filter_small_kn",
            ],
            1,
            f"{KEY}.filter_fqns=auto_filter_small_kn with recipe_name=rowwise_with_gw_hp: torchao has"
            " no size thresholds for this recipe;",
        ),
        (
            [*F8, f"{KEY}.filter_fqns=output,lm_head"],
            1,
            f"{KEY}.filter_fqns: 'lm_head' names no linear layer of llama3 debugmodel (e.g.",
        ),
    ],
)
def test_bad_float8_input_is_one_line(argv, world, expected):
    assert config_error(argv, world).startswith(expected)


def test_float8_on_a_gpu_without_float8_tensor_cores_is_refused_unless_emulated(monkeypatch):
    monkeypatch.setattr(hardware, "gpu_names", lambda: ["NVIDIA A100-SXM4-80GB"])
    monkeypatch.setattr(hardware, "gpu_compute_capabilities", lambda: [(8, 0)])
    monkeypatch.setattr(quantize_checks, "on_cpu", lambda cfg: False)
    cfg = cfg_of([*F8, "--training.device=cuda"])
    with pytest.raises(Exception) as e:
        quantize_checks.check_converters(cfg, None)
    assert str(e.value) == (
        "--model.converters=quantize.linear.float8: NVIDIA A100-SXM4-80GB (compute capability 8.0)"
        " has no float8 tensor cores (SM89 or later); set --quantize.linear.float8.emulate=true"
        " (same numerics, high-precision GEMMs) or train without the converter"
    )
    cfg = cfg_of([*F8, "--training.device=cuda", f"{KEY}.emulate=true"])
    quantize_checks.check_converters(cfg, None)  # emulated: accepted
    monkeypatch.setattr(hardware, "gpu_compute_capabilities", lambda: [(9, 0)])
    quantize_checks.check_converters(cfg_of([*F8, "--training.device=cuda"]), None)  # H100


def test_op_sac_saves_float8_gemm_outputs_and_amaxes_and_recomputes_the_casts():
    """Op SAC sees torchao's float8 GEMM as aten.mm on float8 tensors: it keeps its output (in
    the input's precision) and each operand's amax (a scalar), and recomputes the rest: abs,
    the scale, the cast to float8 (docs/float8.md)."""
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    from torchtitan.distributed.activation_checkpoint import region_policy
    from torchtitan.distributed.plan import RegionSpec

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128, bias=False), nn.ReLU(), nn.Linear(128, 32, bias=False))
    convert_model(model, ["float8"], cfg_of(F8).quantize.linear.float8)
    policy = region_policy(RegionSpec("op", None), frozenset())
    decided = []

    def recording(ctx, func, *args, **kwargs):
        decision = policy(ctx, func, *args, **kwargs)
        if not ctx.is_recompute:
            decided.append((func, decision.name))
        return decision

    x = torch.randn(16, 64, requires_grad=True)
    out = checkpoint(
        model,
        x,
        use_reentrant=False,
        context_fn=lambda: create_selective_checkpoint_contexts(recording),
    )
    out.sum().backward()
    aten = torch.ops.aten
    saved = [f for f, d in decided if d == "MUST_SAVE"]
    assert saved.count(aten.mm.default) == 2  # one GEMM per linear in forward
    assert saved.count(aten.max.default) == 4  # the input's and the weight's amax, per linear
    assert len(saved) == 6
    recomputed = {f for f, d in decided if d != "MUST_SAVE"}
    assert {aten.abs.default, aten.reciprocal.default, aten._to_copy.default} <= recomputed
