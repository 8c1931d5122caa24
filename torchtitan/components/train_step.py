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


IGNORE_INDEX = -100  # F.cross_entropy's default ignore_index: positions without a target


def mtp_shifted_labels(labels: torch.Tensor, depth: int) -> list[torch.Tensor]:
    """[labels shifted left by k along the sequence, the last k positions IGNORE_INDEX] for
    k = 0..depth: row k is, at position t, the token t+1+k (k = 0: the labels themselves)."""
    pad = labels.new_full((*labels.shape[:-1], depth), IGNORE_INDEX)
    padded = torch.cat([labels, pad], dim=-1)
    return [padded[..., k : k + labels.shape[-1]] for k in range(depth + 1)]


def mtp_losses(logits: torch.Tensor, labels: torch.Tensor, valid: list[torch.Tensor], scale: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits [batch, (1 + D) * seq, vocab] and labels [batch, (1 + D) * seq] (the main part,
    then each MTP depth's) -> (main loss: the mean over its tokens, exactly as without MTP;
    MTP loss: the mean over the depths of each depth's mean cross entropy over its non-ignored
    positions). `valid[k]`: depth k's non-ignored positions over the whole (un-CP-sharded)
    sequences, `scale` the CP degree: each CP rank holds 1/scale of them, so the mean over
    the CP ranks (the loss reduction) is the mean over the whole sequences."""
    parts = 1 + len(valid)
    logit_parts, label_parts = logits.chunk(parts, dim=1), labels.chunk(parts, dim=1)
    main = cross_entropy_loss(logit_parts[0], label_parts[0])
    depth_losses = [
        F.cross_entropy(lg.flatten(0, 1).float(), lb.flatten(0, 1), ignore_index=IGNORE_INDEX, reduction="sum")
        * scale / n
        for lg, lb, n in zip(logit_parts[1:], label_parts[1:], valid)
    ]
    return main, sum(depth_losses[1:], depth_losses[0]) / len(depth_losses)


class PipelineLoss:
    """The last pipeline stage's loss of one microbatch, divided by `scale` (microbatches x
    accumulation steps). With multi-token prediction the stage returns main + weight x MTP
    (what backward trains) and keeps the two apart (`main`, `mtp`: sums since `reset`) for
    the log. A microbatch holds whole sequences of `seq_len` tokens (CP shards them over
    `cp_degree` ranks): depth k's (1-based) positions with a target are rows x (seq_len - k),
    its labels' last k having none (the data has no other ignored positions)."""

    def __init__(self, scale: int, mtp_depth: int = 0, mtp_loss_weight: float = 0.0, seq_len: int = 0,
                 cp_degree: int = 1):
        self.scale, self.mtp_depth, self.weight = scale, mtp_depth, mtp_loss_weight
        self.seq_len, self.cp_degree = seq_len, cp_degree
        self.reset()

    def reset(self) -> None:
        self.mains: list[torch.Tensor] = []  # per call; the first step's shape-inference pass calls it too
        self.mtps: list[torch.Tensor] = []

    def parts(self, n: int) -> tuple[torch.Tensor | float, torch.Tensor | float]:
        """Sums of the main and MTP losses of the last `n` calls (the schedule's microbatches)."""
        last = slice(len(self.mains) - n, None)
        return sum(self.mains[last], 0.0), sum(self.mtps[last], 0.0)

    def __call__(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if not self.mtp_depth:
            return cross_entropy_loss(pred, target) / self.scale
        rows = target.shape[0]
        valid = [torch.tensor(rows * (self.seq_len - k), device=target.device) for k in range(1, self.mtp_depth + 1)]
        main, mtp = mtp_losses(pred, target, valid, self.cp_degree)
        main, mtp = main / self.scale, mtp / self.scale
        self.mains.append(local_value(main.detach()))
        self.mtps.append(local_value(mtp.detach()))
        return main + self.weight * mtp


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
    mtp_depth: int = 0  # multi-token prediction depths of the model (model.mtp_depth)
    mtp_loss_weight: float = 0.0  # lambda: the trained objective is loss + lambda * mtp_loss

    def prepare(self, inputs: torch.Tensor, labels: torch.Tensor, mtp: bool = True
                ) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """A local batch -> what this rank feeds its model: its CP chunks of inputs and labels,
        and the model's keyword inputs (the window's global document ids, block_causal).

        With MTP (`mtp_depth` D > 0, unless `mtp` is False: validation scores the main head):
        the labels become [batch, (1 + D) * seq], the main labels then those of each depth
        (shifted left by 1 + k, mtp_shifted_labels), and `mtp_tokens` [batch, D, seq] the
        token ids depth k embeds (its ignored tail as id 0: those positions have no target,
        and under the causal mask no earlier position sees them). Under CP each part is
        sharded on its own, so that this rank's logits parts and label parts line up."""
        inputs, labels = inputs.to(self.device), labels.to(self.device)
        kwargs = {} if self.bos_id is None else {"doc_ids": document_ids(inputs, self.bos_id)}
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
        labels = labels.to(self.device)
        return [(labels[:, k:] != IGNORE_INDEX).sum() for k in range(1, self.mtp_depth + 1)]

    def _phase(self, name: str) -> None:
        if self.on_phase is not None:
            self.on_phase(name)

    def forward_backward(self, batches) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Gradients of one optimizer step over `accum_steps` micro-batches; returns this
        rank's (sum of scaled losses, sum of scaled MoE balance losses, sum of scaled MTP
        losses), as tensors."""
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
                    loss_sum += self.pipeline_losses(inputs, labels, kwargs=kwargs)
                    if self.mtp_depth:
                        mtp_sum += self.pipeline_mtp
                    continue
                probe = (HeldForBackward(self._persistent()) if self.held_for_backward and first
                         else contextlib.nullcontext())
                self._phase("forward")
                with probe:
                    logits = self.model_parts[0](inputs, **kwargs)
                    self._phase("loss")
                    # Every micro-batch has the same token count, so the mean of means is the global mean.
                    if valid is None:
                        ce = cross_entropy_loss(logits, labels) / self.accum_steps
                        mtp_loss = None
                    else:  # the main loss as above; MTP's trained on with its weight, logged apart
                        ce, mtp_loss = mtp_losses(logits, labels, valid, self.cp.degree if self.cp else 1)
                        ce, mtp_loss = ce / self.accum_steps, mtp_loss / self.accum_steps
                    aux = moe_aux_loss(self.model_parts[0])  # MoE balance term: trained on, logged apart
                    loss = ce if aux is None else ce + aux / self.accum_steps
                    if mtp_loss is not None:
                        loss = loss + self.mtp_loss_weight * mtp_loss
                if first and self.held_for_backward:
                    self.held_bytes = probe.held_bytes()
                first = False
                del logits
                self._phase("backward")
                loss.backward()
                loss_sum += local_value(ce.detach())
                if aux is not None:
                    aux_sum += aux.detach() / self.accum_steps
                if mtp_loss is not None:
                    mtp_sum += local_value(mtp_loss.detach())
        return loss_sum, aux_sum, mtp_sum

    def _persistent(self) -> list[torch.Tensor]:
        """Parameters and buffers: they live from step to step, not held for backward."""
        return [t for m in self.model_parts for t in (*m.parameters(), *m.buffers())]

    def pipeline_losses(self, inputs, labels, train: bool = True, kwargs: dict | None = None) -> torch.Tensor:
        """Run the schedule (forward only unless `train`) over one prepared local batch; return
        its (scaled) loss on the last stage (V schedules validate with a backward: the caller
        drops its gradients). `kwargs` reach every stage's model, split by microbatch."""
        loss_fn = self.pipeline._loss_fn if self.mtp_depth else None  # a PipelineLoss
        if loss_fn is not None:
            loss_fn.reset()
        losses = run_schedule(self.pipeline, self.layout, self.stage_ids, inputs, labels, train, kwargs or {})
        if loss_fn is not None:  # the returned losses include the weighted MTP term: log the parts
            main, self.pipeline_mtp = loss_fn.parts(len(losses))
            return main + torch.zeros((), device=self.device)
        return sum((local_value(x.detach()) for x in losses), torch.zeros((), device=self.device))
