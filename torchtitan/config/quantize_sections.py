"""[quantize]: low-precision training, switched on by model.converters (upstream's tables and
keys). Torch-free, like every config module; the converter's names are stated here once.

Float8 (torchao) converts the nn.Linear layers of the model (models/common/float8.py); each
converted GEMM runs as `torch._scaled_mm` on float8 operands with dynamic scales, the
weights, optimizer states and checkpoints staying in high precision.
"""

from dataclasses import dataclass, field
from typing import Literal

# model.converters: the float8 linear converter, its upstream spellings, and the others
FLOAT8_LINEAR = "quantize.linear.float8"
FLOAT8_GROUPED_MM = "quantize.grouped_mm.float8"
MX_LINEAR = "quantize.linear.mx"
MX_GROUPED_MM = "quantize.grouped_mm.mx"
CONVERTER_ALIASES = {"float8": FLOAT8_LINEAR, "mx": MX_LINEAR}  # upstream's older names
CONVERTERS = (FLOAT8_LINEAR, FLOAT8_GROUPED_MM, MX_LINEAR, MX_GROUPED_MM)

# filter_fqns entry that also leaves out the linears too small to gain (torchao's thresholds)
AUTO_FILTER = "auto_filter_small_kn"


def converter_names(converters: list[str]) -> list[str]:
    """model.converters in the canonical spelling (upstream's "float8" is FLOAT8_LINEAR)."""
    return [CONVERTER_ALIASES.get(c, c) for c in converters]


def float8_linear_on(converters: list[str]) -> bool:
    return FLOAT8_LINEAR in converter_names(converters)


@dataclass
class Float8Linear:
    """Float8 training of the model's nn.Linear layers (torchao; [quantize.linear.float8]),
    on when model.converters holds quantize.linear.float8 (or upstream's "float8")."""

    enable_fsdp_float8_all_gather: bool = False
    """FSDP2 gathers the converted weights in float8: each shard is cast with the weight's
    tensorwise scale before the all-gather, half of bf16's bytes (a quarter of fp32's). The
    tensorwise recipe only (a rowwise recipe scales per row and is refused with it); with
    SimpleFSDP refused (its gather is not float8-aware yet)."""

    precompute_float8_dynamic_scale_for_fsdp: bool = False
    """With the float8 all-gather and data_parallel_shard_degree > 1: every converted weight's
    scale is computed after the optimizer step, all of them with one amax all-reduce, instead
    of one all-reduce per weight in the next forward (no effect otherwise)."""

    recipe_name: Literal["", "tensorwise", "rowwise", "rowwise_with_gw_hp"] = ""
    """torchao's float8 recipe. tensorwise (empty, as upstream): one scale per tensor, the
    fastest on H100; rowwise: one scale per row of each operand (more accurate, slower);
    rowwise_with_gw_hp: rowwise, the weight gradient's GEMM kept in high precision."""

    filter_fqns: list[str] = field(default_factory=list)
    """Linear layers kept in high precision: a layer whose name contains an entry is not
    converted (e.g. "output", "router.gate"). "auto_filter_small_kn" among them also leaves
    out the layers whose shapes are too small to gain (torchao's per-recipe thresholds; not
    with rowwise_with_gw_hp). Each entry must name at least one linear layer of the model."""

    emulate: bool = False
    """Run the float8 GEMMs as high-precision matmuls of the float8-rounded operands (same
    numerics, no float8 kernel): for GPUs without float8 tensor cores (below SM89). CPUs run
    the real `_scaled_mm` either way."""


@dataclass
class Float8GroupedMM:
    """Float8 grouped GEMMs of the routed experts ([quantize.grouped_mm.float8]), on when
    model.converters holds quantize.grouped_mm.float8."""

    fqns: list[str] = field(default_factory=list)
    """MoE modules (by name) whose grouped GEMMs would run in float8, e.g. experts. Refused
    for now: no CPU kernel exists (`torch._scaled_grouped_mm`), and the CUDA path is not in
    this fork yet."""


@dataclass
class MXLinear:
    """MX (microscaling) training of nn.Linear ([quantize.linear.mx]); refused in one line
    (not in this fork; on CPU `_scaled_mm` refuses MX block scales)."""

    mxfp8_dim1_cast_kernel_choice: Literal["triton", "cuda", "torch"] = "triton"
    """Kernel casting along dim 1 to mxfp8."""

    recipe_name: str = "mxfp8_cublas"
    """torchao's MX recipe."""

    filter_fqns: list[str] = field(default_factory=lambda: ["output"])
    """Linear layers (by name) kept in high precision."""


@dataclass
class MXGroupedMM:
    """MX grouped GEMMs of the experts ([quantize.grouped_mm.mx]); refused like MXLinear."""

    recipe_name: Literal["mxfp8"] = "mxfp8"
    """torchao's MX recipe for grouped GEMMs."""

    fqns: list[str] = field(default_factory=list)
    """MoE modules (by name) whose grouped GEMMs run in MX."""


@dataclass
class QuantizedLinear:
    float8: Float8Linear = field(default_factory=Float8Linear)
    mx: MXLinear = field(default_factory=MXLinear)


@dataclass
class QuantizedGroupedMM:
    float8: Float8GroupedMM = field(default_factory=Float8GroupedMM)
    mx: MXGroupedMM = field(default_factory=MXGroupedMM)


@dataclass
class Quantize:
    """Low-precision training, read by model.converters (upstream's [quantize] tables)."""

    linear: QuantizedLinear = field(default_factory=QuantizedLinear)
    grouped_mm: QuantizedGroupedMM = field(default_factory=QuantizedGroupedMM)
