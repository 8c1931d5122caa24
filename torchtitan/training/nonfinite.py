"""The first non-finite loss or gradient norm, noted on the device and read at sync points.

Checking each step's loss on the host would read it every step, and on a GPU each read
waits for all queued work (a host sync). Instead every step folds "is this step's loss /
gradient norm finite?" into a small device tensor (no read), and the trainer reads it where
it syncs anyway: logging steps, the last step, and before every checkpoint save or
validation. A run then stops at that sync point, naming the step it happened at and the
value, and no checkpoint is written after a non-finite step: the steps in between did update
the weights (with non-finite values), which is why a save must read the flag first.

`torch._assert_async` would stop the run at the step itself, but on CUDA a device-side
assert kills the context: no one-line error, and no settling of a checkpoint in flight.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

KINDS = ("loss", "gradient norm")


class NonFiniteLossError(RuntimeError):
    pass


class NonFiniteWatch:
    """`record(step, loss, grad_norm)` each step (device ops only); `check()` at a sync point,
    on every rank: raises NonFiniteLossError naming the earliest non-finite step of any rank."""

    def __init__(self, device: torch.device):
        # [step, kind (index into KINDS), value] of this rank's first non-finite figure; step inf: none yet
        self.first = torch.tensor([math.inf, 0.0, 0.0], dtype=torch.float64, device=device)

    @torch.no_grad()
    def record(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        """loss: this rank's part of the step's loss (non-finite here => non-finite globally);
        grad_norm: the global norm. The loss is looked at first, as the host check did."""
        for kind, value in enumerate((loss, grad_norm)):
            value = value.detach().reshape(()).to(torch.float64)
            entry = torch.stack([torch.full_like(value, step), torch.full_like(value, kind), value])
            newly = ~torch.isfinite(value) & torch.isinf(self.first[0])
            self.first = torch.where(newly, entry, self.first)

    def first_step(self) -> tuple[int, str, float] | None:
        """(step, what, value) of the earliest non-finite figure over all ranks, or None (a
        read: one small all-gather, then the host reads it)."""
        if dist.is_initialized() and dist.get_world_size() > 1:
            everyone = [torch.empty_like(self.first) for _ in range(dist.get_world_size())]
            dist.all_gather(everyone, self.first)
            rows = torch.stack(everyone).tolist()
        else:
            rows = [self.first.tolist()]
        step, kind, value = min(rows, key=lambda r: (r[0], r[1]))
        return None if math.isinf(step) else (int(step), KINDS[int(kind)], value)

    def check(self) -> None:
        found = self.first_step()
        if found is not None:
            step, what, value = found
            raise NonFiniteLossError(
                f"{what} is {value} at step {step}: training stopped; lower --optimizer.lr or set"
                " --training.max_norm, then resume from the last checkpoint (none was written after that step)"
            )
