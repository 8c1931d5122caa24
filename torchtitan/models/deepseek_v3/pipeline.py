"""pipeline_deepseekv3: which DeepSeek-V3 modules live on the first and last pipeline stages.
A stage may hold dense blocks, MoE blocks or both."""

from torch import nn

from torchtitan.distributed.pipeline_layout import PipelineLayout
from torchtitan.distributed.pipeline_parallel import split_model

FIRST_STAGE_MODULES = ("tok_embeddings",)
LAST_STAGE_MODULES = ("norm", "output")


def pipeline_deepseekv3(model: nn.Module, layout: PipelineLayout, pp_rank: int) -> list[tuple[int, nn.Module]]:
    return split_model(model, layout, pp_rank, FIRST_STAGE_MODULES, LAST_STAGE_MODULES)
