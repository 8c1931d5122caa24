"""Float8 training of a model's linear layers, with torchao (model.converters =
quantize.linear.float8; config/quantize_sections.py).

The conversion runs on the model on meta, before the pipeline split and the parallel plan: each
nn.Linear that is kept (filter_fqns) becomes torchao's Float8Linear, whose GEMMs run as
`torch._scaled_mm` on float8 operands with dynamic scales (3 per linear and step: the output,
the input gradient and the weight gradient; rowwise_with_gw_hp keeps the weight gradient's in
high precision). Weights, gradients, optimizer states and checkpoints stay in high precision
(a Float8Linear's state dict is a Linear's).

What the layouts read from the converted model, not from the config:
- `float8_tp_styles(module)`: tensor parallel casts a tensorwise Float8Linear's input to float8
  before its all-gather (torchao's Float8ColwiseParallel / Float8RowwiseParallel /
  PrepareFloat8ModuleInput), so sequence parallel's gathers move float8;
- FSDP2 gathers the weights of a converted model with enable_fsdp_float8_all_gather in float8
  (torchao's weight subclass implements FSDP2's pre/post all-gather hooks);
- `precompute_scales`: after the optimizer step, every such weight's scale from one amax
  all-reduce (precompute_float8_dynamic_scale_for_fsdp).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import TYPE_CHECKING

import torch
from torch import nn

from torchtitan.config.quantize_sections import AUTO_FILTER, float8_linear_on

if TYPE_CHECKING:
    from torchtitan.config.quantize_sections import Float8Linear

logger = logging.getLogger(__name__)

FLOAT8_DIM_MULTIPLE = 16  # _scaled_mm's operands: both dims of a weight divisible by 16
# the record_function a simulated step wraps each float8 cast in, followed by the bytes the
# cast moves once fused (planning/simulate/patches.py, planning/step_time/trace.py)
FLOAT8_CAST = "float8::cast"


@functools.cache
def torchao_float8():
    """torchao.float8, imported once and quietly: torchao logs a warning per CUDA / MX kernel
    library it cannot load (every CPU machine) and registers an enum torch 2.13 deprecates."""
    quiet = [logging.getLogger(n) for n in ("torchao", "torch.utils._pytree")]
    levels = [q.level for q in quiet]
    for q in quiet:
        q.setLevel(logging.ERROR)
    try:
        import torchao.float8 as float8
    finally:
        for q, level in zip(quiet, levels):
            q.setLevel(level)
    _gather_float8_as_bytes_on_cpu()
    return float8


def _gather_float8_as_bytes_on_cpu() -> None:
    """Gloo has no float8 type (torch 2.13: an all-gather of float8_e4m3fn fails "Invalid scalar
    type"), so tensor parallel's float8 input gathers cannot run on CPU ranks as torchao issues
    them. On CPU tensors, torchao's all-gather of a Float8TrainingTensor moves the same bytes as
    uint8 and waits at once (the copy is bitwise; its wait is a no-op after); elsewhere
    (NCCL) it runs unchanged."""
    from torchao.float8 import float8_ops

    table = float8_ops.FLOAT8_OPS_TABLE
    funcol = torch.ops._c10d_functional
    for op in (
        funcol.all_gather_into_tensor.default,
        torch.ops.c10d_functional.all_gather_into_tensor.default,
    ):
        original = table[op]
        if getattr(original, "as_bytes", False):
            continue

        def gather(aten_op, args, kwargs=None, original=original):
            fp8 = args[0]
            if fp8._data.device.type != "cpu":
                return original(aten_op, args, kwargs)
            data = fp8._data.contiguous()
            out = funcol.wait_tensor(aten_op(data.view(torch.uint8), *args[1:], **(kwargs or {})))
            return type(fp8)(
                out.view(data.dtype),
                fp8._scale,
                fp8._orig_dtype,
                fp8._linear_mm_config,
                fp8._gemm_input_role,
            )

        gather.as_bytes = True
        table[op] = gather


def linear_config(section: Float8Linear):
    """torchao's Float8LinearConfig of [quantize.linear.float8]."""
    f8 = torchao_float8()
    recipe = section.recipe_name or "tensorwise"
    if recipe == "tensorwise":
        config = f8.Float8LinearConfig(
            enable_fsdp_float8_all_gather=section.enable_fsdp_float8_all_gather
        )
    else:  # the all-gather with a rowwise recipe is refused before launch (checks/quantize.py)
        config = f8.Float8LinearConfig.from_recipe_name(recipe)
    return dataclasses.replace(config, emulate=section.emulate)


def _keep_filter(section: Float8Linear, recipe: str, tied: set[int]):
    """(module, fqn) -> convert it? filter_fqns' entries are parts of names, as upstream;
    AUTO_FILTER adds torchao's size thresholds. A weight whose dims are not multiples of 16
    stays in high precision (no float8 GEMM takes it), and so does a tied one (`tied`: ids of
    weights two modules hold, e.g. an output head that is the embedding)."""
    named = [f for f in section.filter_fqns if f != AUTO_FILTER]
    auto = (
        torchao_float8()._auto_filter_for_recipe(recipe, named)
        if AUTO_FILTER in section.filter_fqns
        else None
    )

    def keep(module: nn.Module, fqn: str) -> bool:
        if not isinstance(module, nn.Linear) or any(f in fqn for f in named):
            return False
        if id(module.weight) in tied:
            return False
        if any(d % FLOAT8_DIM_MULTIPLE for d in module.weight.shape):
            return False
        return auto(module, fqn) if auto is not None else True

    return keep


def convert_model(model: nn.Module, converters: list[str], section: Float8Linear) -> list[str]:
    """Apply model.converters to `model` (on meta, before any split); returns the names of the
    linears converted to float8 (none without the float8 converter)."""
    if not float8_linear_on(converters):
        return []
    linears = {n for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    holders: dict[int, int] = {}
    for m in model.modules():
        for p in m.parameters(recurse=False):
            holders[id(p)] = holders.get(id(p), 0) + 1
    tied = {i for i, n in holders.items() if n > 1}
    torchao_float8().convert_to_float8_training(
        model,
        config=linear_config(section),
        module_filter_fn=_keep_filter(section, section.recipe_name or "tensorwise", tied),
    )
    converted = [n for n, m in model.named_modules() if is_float8_linear(m)]
    kept = sorted(linears - set(converted))
    logger.debug(f"float8: {len(converted)} linears converted, kept in high precision: {kept}")
    return converted


def converted_weights(params, section: Float8Linear, tied: tuple[str, ...] = ()) -> frozenset:
    """Names of the linear weights (models/shapes.Param) that convert_model converts, from the
    shapes alone: the same filter run on a stand-in Linear on meta of each weight's shape
    (`tied`: names of weights that are another module's, never converted). The layout search
    prices these GEMMs at the float8 peak without building the model."""
    keep = _keep_filter(section, section.recipe_name or "tensorwise", set())
    out = []
    for p in params:
        if not p.linear or p.name in tied:
            continue
        with torch.device("meta"):
            stand_in = nn.Linear(p.shape[1], p.shape[0], bias=False)
        if keep(stand_in, p.name.removesuffix(".weight")):
            out.append(p.name)
    return frozenset(out)


def is_float8_linear(module: nn.Module) -> bool:
    if "torchao.float8" not in type(module).__module__:  # torchao never imported: none
        return False
    return isinstance(module, torchao_float8().float8_linear.Float8Linear)


def _tensorwise(module: nn.Module) -> bool:
    """A Float8Linear whose every cast is tensorwise (what torchao's float8 TP styles take)."""
    if not is_float8_linear(module):
        return False
    c = module.config
    casts = (c.cast_config_input, c.cast_config_weight, c.cast_config_grad_output)
    return all(x.scaling_granularity.value == "tensorwise" for x in casts)


@dataclasses.dataclass(frozen=True)
class TpStyles:
    """The parallel styles tensor parallel applies to a module's linears and their input."""

    colwise: type
    rowwise: type
    prepare_input: type
    float8: bool = False


def float8_tp_styles(modules: list[nn.Module]) -> TpStyles:
    """The styles for a group of linears that share one input preparation (attention's
    q / k / v / o, a feed-forward's w1 / w2 / w3): torchao's float8 ones when each is a
    tensorwise Float8Linear (the input is then cast once and gathered in float8), torch's
    otherwise (rowwise recipes: torchao's styles are tensorwise only)."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
    )

    if modules and all(_tensorwise(m) for m in modules):
        tp = torchao_float8_tp()
        return TpStyles(
            tp.Float8ColwiseParallel, tp.Float8RowwiseParallel, tp.PrepareFloat8ModuleInput, True
        )
    return TpStyles(ColwiseParallel, RowwiseParallel, PrepareModuleInput)


def torchao_float8_tp():
    torchao_float8()
    import torchao.float8.float8_tensor_parallel as tp

    return tp


def precompute_scales_on(section: Float8Linear, converters: list[str], dp_shard: int) -> bool:
    """precompute_float8_dynamic_scale_for_fsdp takes effect: float8 on, its all-gather on,
    and the weights sharded (with one shard there is no all-gather to feed)."""
    return (
        float8_linear_on(converters)
        and section.enable_fsdp_float8_all_gather
        and section.precompute_float8_dynamic_scale_for_fsdp
        and dp_shard > 1
    )


def precompute_scales(model_parts: list[nn.Module]) -> None:
    """Each part's float8-gathered weights' scales, from one amax all-reduce per part (torchao;
    after the optimizer step, so the next forward's gathers need no all-reduce each)."""
    f8 = torchao_float8()
    for part in model_parts:
        f8.precompute_float8_dynamic_scale_for_fsdp(part)


def _weight_wrapper(t) -> bool:
    """torchao's float8 all-gather weight (WeightWithDynamicFloat8CastTensor): a high-precision
    tensor in a subclass whose FSDP2 hooks cast it before the gather."""
    return "torchao.float8" in type(t).__module__ and hasattr(t, "_tensor")


def plain_tensor(t):
    """`t`, or the high-precision tensor inside it if it is torchao's float8 all-gather weight
    wrapper (which holds no storage of its own)."""
    return t._tensor if _weight_wrapper(t) else t


def plain_weights(state: dict) -> dict:
    """A model or optimizer state dict with torchao's float8 all-gather weight wrappers (bare,
    or as a DTensor's local tensor) replaced by the high-precision tensors they wrap, sharing
    their storage: a checkpoint then holds plain tensors that any run can load, with float8
    or without (DCP would otherwise pickle the subclass, which only torchao can unpickle)."""
    from torch.distributed.tensor import DTensor

    def plain(t):
        if isinstance(t, DTensor) and _weight_wrapper(t._local_tensor):
            return DTensor.from_local(
                t._local_tensor._tensor,
                t.device_mesh,
                t.placements,
                run_check=False,
                shape=t.shape,
                stride=t.stride(),
            )
        return plain_tensor(t)

    with torch.no_grad():
        return {k: plain(v) for k, v in state.items()}
