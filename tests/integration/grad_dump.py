"""Run one training step without the update and save every parameter's full gradient.

    torchrun --nproc_per_node=N tests/integration/grad_dump.py OUT.pt [config overrides]

test_gradients.py compares a layout's gradients with one rank's, tensor by tensor: a loss
curve hides gradient bugs that touch a small part of the model (or only its scale, under
Adam), a direct comparison does not.
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from torchtitan.checks import load_config_or_exit
from torchtitan.models.common.init import clean_fqn
from torchtitan.train import Trainer


def main() -> None:
    out, argv = sys.argv[1], sys.argv[2:]
    trainer = Trainer(load_config_or_exit(argv, int(os.environ["WORLD_SIZE"])))
    trainer.optimizers.step = lambda: None  # keep the weights: only the gradients matter
    data = iter(trainer.dataloader)
    trainer.train_step([next(data) for _ in range(trainer.shape.accum_steps)], step=1)
    grads = {}
    for part in trainer.model_parts:
        for name, p in part.named_parameters():
            if p.grad is not None:
                grads[clean_fqn(name)] = (
                    p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
                )
    if trainer.runner.pipeline is not None:  # every stage's gradients, gathered on rank 0
        parts = [None] * trainer.dims.pp
        dist.all_gather_object(parts, grads, group=trainer.dims.pp_group())
        grads = {k: v for p in parts for k, v in p.items()}
    if dist.get_rank() == 0:
        torch.save(grads, out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
