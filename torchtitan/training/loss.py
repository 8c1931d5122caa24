"""The loss, defined once: the training step, the pipeline's last stage and validation all use
`Loss`, and every figure stays a device tensor (reading one on the host is the caller's
decision).

The objective of a (micro)batch is main + aux + mtp_weight x mtp, each part a mean over its
tokens divided by `scale` (the forward/backward passes one rank makes per optimizer step:
accumulation steps x pipeline microbatches), so summing a rank's parts over its passes and
averaging over the ranks holding different tokens (`global_sum` / their count) gives the mean
over the global batch:
- main: the next token's cross entropy;
- mtp: with multi-token prediction, the mean over the depths of each depth's mean cross
  entropy over its positions with a target (mtp_losses);
- aux: the MoE balance loss (models/common/moe.py), already a mean; under PP the last stage
  returns it with the logits.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Replicate

from torchtitan.distributed.compile import compile_function

IGNORE_INDEX = -100  # F.cross_entropy's default ignore_index: positions without a target


def cross_entropy_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))


def mtp_shifted_labels(labels: torch.Tensor, depth: int) -> list[torch.Tensor]:
    """[labels shifted left by k along the sequence, the last k positions IGNORE_INDEX] for
    k = 0..depth: row k is, at position t, the token t+1+k (k = 0: the labels themselves)."""
    pad = labels.new_full((*labels.shape[:-1], depth), IGNORE_INDEX)
    padded = torch.cat([labels, pad], dim=-1)
    return [padded[..., k : k + labels.shape[-1]] for k in range(depth + 1)]


def mtp_losses(
    logits: torch.Tensor, labels: torch.Tensor, valid: list[torch.Tensor], scale: int
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
        F.cross_entropy(
            lg.flatten(0, 1).float(), lb.flatten(0, 1), ignore_index=IGNORE_INDEX, reduction="sum"
        )
        * scale
        / n
        for lg, lb, n in zip(logit_parts[1:], label_parts[1:], valid)
    ]
    return main, sum(depth_losses[1:], depth_losses[0]) / len(depth_losses)


def local_value(t: torch.Tensor) -> torch.Tensor:
    """A replicated DTensor (loss-parallel loss) as a plain tensor."""
    return t.full_tensor() if isinstance(t, DTensor) else t


class Loss:
    """The loss of the model's output (module docstring). `scale`: forward/backward passes per
    optimizer step; `mtp_depth`, `mtp_weight`: multi-token prediction (0: off); `seq_len`
    and `cp_degree`: a sequence's tokens and the context-parallel ranks sharing them.

    Called by a pipeline schedule as its loss function (last stage, one microbatch of whole
    sequences): returns the objective and, with MTP, keeps the scaled main and MTP parts
    apart for the log (`pipeline_parts`)."""

    def __init__(
        self,
        scale: int,
        mtp_depth: int = 0,
        mtp_weight: float = 0.0,
        seq_len: int = 0,
        cp_degree: int = 1,
    ):
        self.scale, self.mtp_depth, self.mtp_weight = scale, mtp_depth, mtp_weight
        self.seq_len, self.cp_degree = seq_len, cp_degree
        self._main, self._mtp = cross_entropy_loss, mtp_losses
        self.reset()

    def compile(self, backend: str) -> None:
        """compile.components holds "loss": the cross entropy (and MTP's) run compiled, one
        graph each (the logits' cast to float32 fused into the loss kernel)."""
        self._main = compile_function(cross_entropy_loss, backend, "loss")
        self._mtp = compile_function(mtp_losses, backend, "loss")

    def terms(
        self,
        logits: torch.Tensor,
        labels: torch.Tensor,
        valid: list[torch.Tensor] | None = None,
        mtp: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(main, mtp) of one pass, divided by `scale`; mtp is None without multi-token
        prediction (or with mtp=False: logits and labels hold the main part only). `valid`:
        each depth's positions with a target in the whole sequences of this pass (counted
        from the labels before CP sharding); None: every position but a depth's last k, as
        the data has no other ignored position."""
        if not (mtp and self.mtp_depth):
            return self._main(logits, labels) / self.scale, None
        if valid is None:
            rows = labels.shape[0]
            valid = [
                torch.tensor(rows * (self.seq_len - k), device=labels.device)
                for k in range(1, self.mtp_depth + 1)
            ]
        main, mtp_loss = self._mtp(logits, labels, valid, self.cp_degree)
        return main / self.scale, mtp_loss / self.scale

    def objective(
        self, main: torch.Tensor, mtp: torch.Tensor | None, aux: torch.Tensor | None
    ) -> torch.Tensor:
        """What backward trains: main + aux / scale + mtp_weight x mtp (`aux` as the MoE layers
        computed it, unscaled)."""
        if aux is not None and isinstance(main, DTensor) and not isinstance(aux, DTensor):
            # loss parallel: the loss is a replicated DTensor, the balance loss a plain tensor
            # that every TP rank computed alike (summed over the TP group)
            mesh = main.device_mesh
            aux = DTensor.from_local(aux, mesh, [Replicate()] * mesh.ndim, run_check=False)
        loss = main if aux is None else main + aux / self.scale
        return loss if mtp is None else loss + self.mtp_weight * mtp

    # ------------------------------------------------------------------ as a pipeline's loss_fn

    def reset(self) -> None:
        """Forget the parts recorded so far (the first step's shape inference calls it too)."""
        self.mains: list[torch.Tensor] = []
        self.mtps: list[torch.Tensor] = []
        self.auxes: list[torch.Tensor] = []

    def pipeline_parts(self, n: int) -> tuple[torch.Tensor | float, ...]:
        """Sums of the main, MTP and balance-loss parts of the last `n` calls (the schedule's
        microbatches); 0.0 for a part not recorded."""
        last = slice(len(self.mains) - n, None)
        return sum(self.mains[last], 0.0), sum(self.mtps[last], 0.0), sum(self.auxes[last], 0.0)

    def __call__(
        self, pred: torch.Tensor | tuple[torch.Tensor, torch.Tensor], target: torch.Tensor
    ) -> torch.Tensor:
        """`pred`: the last stage's logits, or (logits, the model's MoE balance loss) when the
        loss spans the stages (models/common/moe.stage_switch_statistics)."""
        aux = None
        if isinstance(pred, tuple):
            pred, aux = pred[0], pred[1].sum()
        main, mtp = self.terms(pred, target)
        if mtp is None and aux is None:
            return main
        self.mains.append(local_value(main.detach()))
        if mtp is not None:
            self.mtps.append(local_value(mtp.detach()))
        if aux is not None:
            self.auxes.append(aux.detach() / self.scale)
        return self.objective(main, mtp, aux)


def global_sum(
    value: torch.Tensor, loss_group: dist.ProcessGroup, pp_group: dist.ProcessGroup | None = None
) -> torch.Tensor:
    """A rank's sum of scaled parts -> their sum over the global batch, on the device (in
    place): over the pipeline stages (only the last computed it; the others hold 0), then over
    the `loss_group` of the ranks holding different tokens. Divided by that group's size it is
    the global batch's mean; the caller divides where it reads it (on the host, exactly)."""
    if pp_group is not None:
        dist.all_reduce(value, group=pp_group)
    dist.all_reduce(value, op=dist.ReduceOp.SUM, group=loss_group)
    return value
