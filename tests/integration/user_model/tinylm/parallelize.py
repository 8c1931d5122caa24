"""The shared steps on one model part: activation checkpointing -> compile -> data parallel
(no tensor parallel plan: this model leaves TP out)."""

from torch import nn

from tinylm.args import FLAVORS
from tinylm.model import TinyLM
from torchtitan.distributed.activation_checkpoint import apply_ac
from torchtitan.distributed.compile import apply_compile
from torchtitan.distributed.data_parallel import apply_data_parallel, fsdp_ac_groups
from torchtitan.models.train_spec import TrainSpec


def parallelize_tinylm(
    model: nn.Module, dims, plan, parallelism, compile_cfg, precision
) -> nn.Module:
    apply_ac(model, plan.regions, fsdp_ac_groups(dims, parallelism.fsdp_implementation))
    if compile_cfg.enable:
        apply_compile(model.layers, compile_cfg)
    apply_data_parallel(model, dims, plan, parallelism.fsdp_implementation, precision)
    return model


TRAIN_SPEC = TrainSpec("tinylm", TinyLM, FLAVORS, parallelize_tinylm)
