"""parallelize_llama: data parallel (FSDP2 / HSDP) applied to one Llama3 model part."""

from torch import nn

from torchtitan.config.job_config import JobConfig
from torchtitan.distributed.fsdp import apply_fsdp2, mixed_precision
from torchtitan.distributed.parallel_dims import ParallelDims


def fsdp_units(model: nn.Module) -> list[str]:
    """FSDP units in forward order: each block, then the root (embeddings, norm, output)."""
    return [f"layers.{name}" for name in model.layers.keys()] + [""]


def parallelize_llama(model: nn.Module, parallel_dims: ParallelDims, job_config: JobConfig, param_dtype: str) -> nn.Module:
    units = fsdp_units(model)
    # Every block reshards after forward; the root does not, since its output layer runs
    # first in backward and would be gathered again at once.
    plan = {name: bool(name) for name in units}
    mp = mixed_precision(param_dtype, job_config.training.mixed_precision_reduce)
    apply_fsdp2(model, parallel_dims.submesh("fsdp"), mp, plan)
    return model
