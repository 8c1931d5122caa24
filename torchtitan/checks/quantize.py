"""model.converters and [quantize]: the converters this fork runs, the float8 keys' combinations,
and the hardware float8 needs, each refused in one line before launch. Torch-free.

What runs: quantize.linear.float8 (torchao float8 linears, every layout; models/common/float8.py).
What is refused, and why: MX (microscaling) training (`_scaled_mm` refuses MX block scales on
CPU; not in this fork); float8 grouped GEMMs of routed experts on CPU (no
`torch._scaled_grouped_mm` kernel there) and on CUDA until they land; the float8 all-gather
with a rowwise recipe (its scales are per row, FSDP's cast is per tensor: torchao and upstream
refuse it) or under SimpleFSDP (its gather is not float8-aware); float8 on a GPU without float8
tensor cores (below SM89) unless emulate.
"""

from torchtitan import hardware
from torchtitan.checks.compile_keys import on_cpu
from torchtitan.config.job_config import JobConfig
from torchtitan.config.manager import ConfigError
from torchtitan.config.quantize_sections import (
    AUTO_FILTER,
    CONVERTER_ALIASES,
    CONVERTERS,
    FLOAT8_GROUPED_MM,
    FLOAT8_LINEAR,
    MX_GROUPED_MM,
    MX_LINEAR,
    converter_names,
)

FLOAT8_KEY = "--quantize.linear.float8"
MIN_FLOAT8_CAPABILITY = (8, 9)  # Ada / Hopper and later have float8 tensor cores


def check_converters(cfg: JobConfig, linear_names: list[str] | None = None) -> None:
    """Raise ConfigError for the first converter or [quantize] key that cannot run.
    `linear_names`: the model's linear layers (models/shapes.py), to check filter_fqns."""
    names = converter_names(cfg.model.converters)
    given = ",".join(cfg.model.converters)
    for raw, name in zip(cfg.model.converters, names):
        if name not in CONVERTERS:
            known = ", ".join((*CONVERTERS, *CONVERTER_ALIASES))
            raise ConfigError(
                f"--model.converters={given}: unknown converter {raw!r}; choose from {known}"
            )
        if name in (MX_LINEAR, MX_GROUPED_MM):
            raise ConfigError(
                f"--model.converters={given}: MX (microscaling) training is not in this fork"
                " (on CPU `_scaled_mm` refuses MX block scales); use quantize.linear.float8"
            )
        if name == FLOAT8_GROUPED_MM:
            where = (
                "on CPU: torch has no float8 grouped GEMM kernel (`_scaled_grouped_mm`) there"
                if on_cpu(cfg)
                else "on CUDA: not in this fork yet"
            )
            raise ConfigError(
                f"--model.converters={given}: float8 routed experts are refused {where}; remove"
                f" {raw} (the experts train in the parameter dtype) and keep quantize.linear.float8"
                " for the dense layers"
            )
    if len(set(names)) < len(names):
        raise ConfigError(f"--model.converters={given}: a converter is named twice; name it once")
    if FLOAT8_LINEAR in names:
        check_float8_linear(cfg, linear_names)


def check_float8_linear(cfg: JobConfig, linear_names: list[str] | None) -> None:
    f8 = cfg.quantize.linear.float8
    recipe = f8.recipe_name or "tensorwise"
    if f8.enable_fsdp_float8_all_gather and recipe != "tensorwise":
        raise ConfigError(
            f"{FLOAT8_KEY}.enable_fsdp_float8_all_gather with recipe_name={recipe}: the float8"
            " all-gather casts each weight with one tensorwise scale; use recipe_name=tensorwise"
            " (or empty) or turn the all-gather off"
        )
    p = cfg.parallelism
    if f8.enable_fsdp_float8_all_gather and p.fsdp_implementation == "simple_fsdp":
        raise ConfigError(
            f"{FLOAT8_KEY}.enable_fsdp_float8_all_gather with fsdp_implementation=simple_fsdp:"
            " SimpleFSDP's all-gather is not float8-aware (it would gather the high-precision"
            " weights); use --parallelism.fsdp_implementation=fsdp2 or turn the all-gather off"
        )
    if AUTO_FILTER in f8.filter_fqns and recipe == "rowwise_with_gw_hp":
        raise ConfigError(
            f"{FLOAT8_KEY}.filter_fqns={AUTO_FILTER} with recipe_name=rowwise_with_gw_hp: torchao"
            " has no size thresholds for this recipe; name the layers to keep instead"
        )
    if linear_names is not None:
        for entry in f8.filter_fqns:
            if entry != AUTO_FILTER and not any(entry in n for n in linear_names):
                raise ConfigError(
                    f"{FLOAT8_KEY}.filter_fqns: {entry!r} names no linear layer of"
                    f" {cfg.model.name} {cfg.model.flavor} (e.g. {', '.join(linear_names[-2:])});"
                    " give a part of a layer's name"
                )
    if not on_cpu(cfg) and not f8.emulate:
        for name, cap in zip(hardware.gpu_names(), hardware.gpu_compute_capabilities()):
            if cap < MIN_FLOAT8_CAPABILITY:
                raise ConfigError(
                    f"--model.converters={FLOAT8_LINEAR}: {name} (compute capability"
                    f" {cap[0]}.{cap[1]}) has no float8 tensor cores (SM89 or later); set"
                    f" {FLOAT8_KEY}.emulate=true (same numerics, high-precision GEMMs) or"
                    " train without the converter"
                )
