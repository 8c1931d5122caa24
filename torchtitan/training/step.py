"""The forward/backward of one optimizer step (and of a validation batch), shared by the
trainer and the memory simulation (which runs it on fake tensors: nothing here may read a
tensor's value). The loss is training/loss.py's."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from torchtitan.distributed.pipeline_parallel import run_schedule
from torchtitan.distributed.tensor_parallel import loss_parallel_context
from torchtitan.models.common.attention import ContextParallel, document_ids
from torchtitan.models.common.moe import moe_aux_loss
from torchtitan.observe.held_for_backward import HeldForBackward
from torchtitan.training.loss import IGNORE_INDEX, Loss, local_value, mtp_shifted_labels
from torchtitan.training.phases import StepPhase


@dataclass
class StepSums:
    """One rank's sums over a step's passes of the scaled loss parts (device tensors): main,
    the MoE balance loss, the MTP loss (loss.global_sum over the ranks gives the global batch's)."""

    main: torch.Tensor
    aux: torch.Tensor
    mtp: torch.Tensor


@dataclass
class StepResult:
    """One optimizer step's figures as the step left them: on the device, unread and not
    reduced over the ranks (the trainer does both at a sync point only)."""

    sums: StepSums
    grad_norm: torch.Tensor  # the global norm before clipping
    load: torch.Tensor | None = None  # MoE: this rank's expert load (training/expert_balance.py)
    committed: bool = True  # fault tolerance: every replica group in the quorum finished it


@dataclass
class StepRunner:
    """What one rank runs per step: its model parts, or the pipeline schedule over them, and
    the loss (`loss`: by default the plain next-token loss over `accum_steps` passes)."""

    model_parts: list[nn.Module]
    device: torch.device
    accum_steps: int
    loss: Loss | None = None
    loss_parallel: bool = False
    pipeline: object | None = None  # a torch.distributed.pipelining schedule
    layout: object | None = None  # its PipelineLayout
    stage_ids: list[int] = field(default_factory=lambda: [0])
    held_for_backward: bool = False  # measure the first micro-batch's held bytes (trainer metric)
    on_phase: Callable[[StepPhase], None] | None = None  # told each phase (memory simulation)
    held_bytes: int = 0
    # set: the block-causal mask; documents told apart by (token id, True: it starts one | False: it ends one)
    doc_delimiter: tuple[int, bool] | None = None
    cp: ContextParallel | None = None  # context parallel: this rank's place in its CP group

    def __post_init__(self) -> None:
        if self.loss is None:
            self.loss = Loss(self.accum_steps)

    @property
    def mtp_depth(self) -> int:
        """Multi-token prediction depths of the model (the loss's)."""
        return self.loss.mtp_depth

    def prepare(
        self, inputs: torch.Tensor, labels: torch.Tensor, mtp: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """A local batch -> what this rank feeds its model: its CP chunks of inputs and labels,
        and the model's keyword inputs (the window's global document ids, block_causal).

        With MTP (`mtp_depth` D > 0, unless `mtp` is False: validation scores the main head):
        the labels become [batch, (1 + D) * seq], the main labels then those of each depth
        (shifted left by 1 + k, mtp_shifted_labels), and `mtp_tokens` [batch, D, seq] the
        token ids depth k embeds (its ignored tail as id 0: those positions have no target,
        and under the causal mask no earlier position sees them). Under CP each part is
        sharded on its own, so that this rank's logits parts and label parts line up."""
        # non_blocking: a blocking host-to-GPU copy waits for the device (a host sync)
        inputs, labels = (
            inputs.to(self.device, non_blocking=True),
            labels.to(self.device, non_blocking=True),
        )
        kwargs = (
            {}
            if self.doc_delimiter is None
            else {"doc_ids": document_ids(inputs, *self.doc_delimiter)}
        )
        shard = self.cp.shard if self.cp is not None else (lambda t: t)
        inputs = shard(inputs)
        if not (mtp and self.mtp_depth):
            return inputs, shard(labels), kwargs
        shifted = [shard(t) for t in mtp_shifted_labels(labels, self.mtp_depth)]
        kwargs["mtp_tokens"] = torch.stack(shifted[:-1], dim=1).clamp(min=0)
        return inputs, torch.cat(shifted, dim=1), kwargs

    def mtp_valid(self, labels: torch.Tensor) -> list[torch.Tensor]:
        """Per MTP depth k (1-based shift k + 1), its non-ignored positions in this local batch
        (whole sequences, before any CP sharding): tensors, no host sync."""
        labels = labels.to(self.device, non_blocking=True)
        return [(labels[:, k:] != IGNORE_INDEX).sum() for k in range(1, self.mtp_depth + 1)]

    def _phase(self, phase: StepPhase) -> None:
        if self.on_phase is not None:
            self.on_phase(phase)

    def forward_backward(self, batches) -> StepSums:
        """Gradients of one optimizer step over `accum_steps` micro-batches; returns this
        rank's sums of the scaled loss parts."""
        for m in self.model_parts:
            m.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), device=self.device)
        aux_sum = torch.zeros((), device=self.device)
        mtp_sum = torch.zeros((), device=self.device)
        first = True
        with loss_parallel_context(self.loss_parallel):
            for inputs, labels in batches:
                valid = self.mtp_valid(labels) if self.mtp_depth else None
                inputs, labels, kwargs = self.prepare(inputs, labels)
                if self.pipeline is not None:
                    main, mtp, aux = self.pipeline_losses(inputs, labels, kwargs=kwargs)
                    loss_sum += main
                    mtp_sum += mtp
                    aux_sum += aux
                    continue
                probe = (
                    HeldForBackward(self._persistent())
                    if self.held_for_backward and first
                    else contextlib.nullcontext()
                )
                self._phase(StepPhase.FORWARD)
                with probe:
                    logits = self.model_parts[0](inputs, **kwargs)
                    self._phase(StepPhase.LOSS)
                    main, mtp_loss = self.loss.terms(logits, labels, valid)
                    aux = moe_aux_loss(
                        self.model_parts[0]
                    )  # MoE balance term: trained on, logged apart
                    loss = self.loss.objective(main, mtp_loss, aux)
                if first and self.held_for_backward:
                    self.held_bytes = probe.held_bytes()
                first = False
                del logits
                self._phase(StepPhase.BACKWARD)
                loss.backward()
                loss_sum += local_value(main.detach())
                if aux is not None:
                    aux_sum += aux.detach() / self.accum_steps
                if mtp_loss is not None:
                    mtp_sum += local_value(mtp_loss.detach())
        return StepSums(loss_sum, aux_sum, mtp_sum)

    @torch.no_grad()
    def evaluate(self, batches) -> torch.Tensor:
        """The forward of one global batch's passes without backward or update (validation):
        this rank's sum of the scaled main losses (the next token's, as training reports it)."""
        loss_sum = torch.zeros((), device=self.device)
        with loss_parallel_context(self.loss_parallel):
            for inputs, labels in batches:
                if self.pipeline is not None:
                    inputs, labels, kwargs = self.prepare(inputs, labels)
                    loss_sum += self.pipeline_losses(inputs, labels, train=False, kwargs=kwargs)[0]
                    continue
                inputs, labels, kwargs = self.prepare(
                    inputs, labels, mtp=False
                )  # the main head only
                logits = self.model_parts[0](inputs, **kwargs)
                loss_sum += local_value(self.loss.terms(logits, labels, mtp=False)[0])
        return loss_sum

    def _persistent(self) -> list[torch.Tensor]:
        """Parameters and buffers: they live from step to step, not held for backward."""
        return [t for m in self.model_parts for t in (*m.parameters(), *m.buffers())]

    def pipeline_losses(
        self, inputs, labels, train: bool = True, kwargs: dict | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | float, torch.Tensor | float]:
        """Run the schedule (forward only unless `train`) over one prepared local batch; return
        the sums of its scaled main, MTP and balance losses on the last stage (zeros elsewhere; V
        schedules validate with a backward: the caller drops its gradients). `kwargs` reach
        every stage's model, split by microbatch."""
        self.loss.reset()
        losses = run_schedule(
            self.pipeline,
            self.layout,
            self.stage_ids,
            inputs,
            labels,
            train=train,
            kwargs=kwargs or {},
        )
        if (
            self.loss.mains
        ):  # the returned losses include the MTP / balance terms: the parts were kept apart
            main, mtp, aux = self.loss.pipeline_parts(len(losses))
            return main + torch.zeros((), device=self.device), mtp, aux
        return (
            sum((local_value(x.detach()) for x in losses), torch.zeros((), device=self.device)),
            0.0,
            0.0,
        )
