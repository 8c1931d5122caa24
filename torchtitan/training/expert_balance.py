"""After every optimizer step: auxiliary-loss-free load balancing of the MoE layers and the
expert-load figures of the step.

Each MoE layer counts the token copies routed to each expert during the step's training
forwards (every microbatch and accumulation step; activation-checkpoint recomputes do not
count). The counts are summed over every rank that routed tokens of the global batch
through the same layers (data-parallel and TP ranks: with sequence parallel each TP rank
routes its own tokens), so every rank moves the bias by the same amount whatever the
layout. A pipeline rank without MoE layers has nothing to do here but joins the load figure.
"""

import math

import torch
import torch.distributed as dist

from torchtitan.models.common.moe import moe_modules, update_expert_bias


class ExpertBalancer:
    def __init__(self, model_parts, device, batch_group, pp_group=None):
        """batch_group: the ranks of one pipeline stage that see different tokens."""
        self.moes = [m for part in model_parts for m in moe_modules(part)]
        self.device, self.batch_group, self.pp_group = device, batch_group, pp_group

    @torch.no_grad()
    def step(self) -> torch.Tensor:
        """Update every layer's bias from the step's global counts; return this rank's expert
        load over its layers, on the device (nothing read): (-min, max) tokens per expert
        relative to the layer's mean (-inf, -inf without MoE layers)."""
        load = torch.tensor(
            [-float("inf"), -float("inf")], device=self.device
        )  # (-min, max): one MAX reduction
        if self.moes:
            counts = torch.stack([m.tokens_per_expert for m in self.moes])
            dist.all_reduce(counts, group=self.batch_group)
            for moe, layer_counts in zip(self.moes, counts):
                update_expert_bias(moe, layer_counts, moe.load_balance_coeff)
            counts = counts.double()
            ratio = counts / counts.mean(dim=1, keepdim=True).clamp_min(1e-12)
            load = torch.stack([-ratio.min(), ratio.max()]).float()
        return load

    @torch.no_grad()
    def figures(self, load: torch.Tensor) -> dict:
        """A step's load (`step`'s result) over every pipeline stage, read on the host: only
        on the steps that log (every rank of the job calls it there)."""
        if self.pp_group is not None:
            dist.all_reduce(load, op=dist.ReduceOp.MAX, group=self.pp_group)
        low, high = load.tolist()
        if not (math.isfinite(low) and math.isfinite(high)):
            return {}
        return {"expert_load_min": -low, "expert_load_max": high}
