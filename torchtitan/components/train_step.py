"""The forward/backward of one optimizer step, shared by the trainer and the memory
simulation (which runs it on fake tensors: nothing here may read a tensor's value)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from torchtitan.components.memory_probe import HeldForBackward
from torchtitan.distributed.pipeline_parallel import run_schedule
from torchtitan.distributed.tensor_parallel import loss_parallel_context
from torchtitan.models.common.attention import ContextParallel, document_ids
from torchtitan.models.common.moe import moe_aux_loss


def cross_entropy_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))


def local_value(t: torch.Tensor) -> torch.Tensor:
    """A replicated DTensor (loss-parallel loss) as a plain tensor."""
    return t.full_tensor() if isinstance(t, DTensor) else t


@dataclass
class StepRunner:
    """What one rank runs per step: its model parts, or the pipeline schedule over them."""

    model_parts: list[nn.Module]
    device: torch.device
    accum_steps: int
    loss_parallel: bool = False
    pipeline: object | None = None  # a torch.distributed.pipelining schedule
    layout: object | None = None  # its PipelineLayout
    stage_ids: list[int] = field(default_factory=lambda: [0])
    held_for_backward: bool = False  # measure the first micro-batch's held bytes (trainer metric)
    on_phase: Callable[[str], None] | None = None  # told "forward" / "backward" / ... (memory simulation)
    held_bytes: int = 0
    bos_id: int | None = None  # set: the block-causal mask, documents told apart by this token
    cp: ContextParallel | None = None  # context parallel: this rank's place in its CP group

    def prepare(self, inputs: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """A local batch -> what this rank feeds its model: its CP chunks of inputs and labels,
        and the model's keyword inputs (the window's global document ids, block_causal)."""
        inputs, labels = inputs.to(self.device), labels.to(self.device)
        kwargs = {} if self.bos_id is None else {"doc_ids": document_ids(inputs, self.bos_id)}
        if self.cp is not None:
            inputs, labels = self.cp.shard(inputs), self.cp.shard(labels)
        return inputs, labels, kwargs

    def _phase(self, name: str) -> None:
        if self.on_phase is not None:
            self.on_phase(name)

    def forward_backward(self, batches) -> tuple[torch.Tensor, torch.Tensor]:
        """Gradients of one optimizer step over `accum_steps` micro-batches; returns this
        rank's (sum of scaled losses, sum of scaled MoE balance losses), as tensors."""
        for m in self.model_parts:
            m.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), device=self.device)
        aux_sum = torch.zeros((), device=self.device)
        first = True
        with loss_parallel_context(self.loss_parallel):
            for inputs, labels in batches:
                inputs, labels, kwargs = self.prepare(inputs, labels)
                if self.pipeline is not None:
                    loss_sum += self.pipeline_losses(inputs, labels, kwargs=kwargs)
                    continue
                probe = (HeldForBackward(self._persistent()) if self.held_for_backward and first
                         else contextlib.nullcontext())
                self._phase("forward")
                with probe:
                    logits = self.model_parts[0](inputs, **kwargs)
                    self._phase("loss")
                    # Every micro-batch has the same token count, so the mean of means is the global mean.
                    ce = cross_entropy_loss(logits, labels) / self.accum_steps
                    aux = moe_aux_loss(self.model_parts[0])  # MoE balance term: trained on, logged apart
                    loss = ce if aux is None else ce + aux / self.accum_steps
                if first and self.held_for_backward:
                    self.held_bytes = probe.held_bytes()
                first = False
                del logits
                self._phase("backward")
                loss.backward()
                loss_sum += local_value(ce.detach())
                if aux is not None:
                    aux_sum += aux.detach() / self.accum_steps
        return loss_sum, aux_sum

    def _persistent(self) -> list[torch.Tensor]:
        """Parameters and buffers: they live from step to step, not held for backward."""
        return [t for m in self.model_parts for t in (*m.parameters(), *m.buffers())]

    def pipeline_losses(self, inputs, labels, train: bool = True, kwargs: dict | None = None) -> torch.Tensor:
        """Run the schedule (forward only unless `train`) over one prepared local batch; return
        its (scaled) loss on the last stage (V schedules validate with a backward: the caller
        drops its gradients). `kwargs` reach every stage's model, split by microbatch."""
        losses = run_schedule(self.pipeline, self.layout, self.stage_ids, inputs, labels, train, kwargs or {})
        return sum((local_value(x.detach()) for x in losses), torch.zeros((), device=self.device))
