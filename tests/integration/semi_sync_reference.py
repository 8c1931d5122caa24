"""LocalSGD and DiLoCo written out by hand over G replicas in one process, for comparison with
torchft's in a real fault-tolerant run (test_semi_sync_runs.py).

    torchrun --nproc_per_node=1 tests/integration/semi_sync_reference.py OUT.json METHODS
        GROUPS SYNC_STEPS OUTER_LR OUTER_MOMENTUM [config overrides]

METHODS: local_sgd, diloco, diloco:N (N fragments: Streaming DiLoCo), comma-separated, each
from the same initial weights.

One trainer (one rank, no fault tolerance) takes each replica's inner steps in turn: replica
g's weights and AdamW state are put in, it trains on the rows replica g reads in the real run
(data rank g of G), and its weights and state are taken out again. Every SYNC_STEPS steps:

- local_sgd: every replica's weights become their mean;
- diloco: the pseudo-gradient mean over the replicas of (global - local) steps the global
  weights with SGD and Nesterov momentum (buf = m * buf + d, the first buf = d;
  global -= lr * (d + m * buf)), and every replica continues from them.
- diloco:N: the same for one fragment at a time, every SYNC_STEPS steps (the run's sync_steps
  is N x SYNC_STEPS), the fragments in turn (the trainer's split, semi_sync.fragments).

OUT.json: {method: [[loss of replica g at step s, ...] for g]}.
"""

import copy
import json
import os
import sys
from types import SimpleNamespace

import torch

from torchtitan.checks import load_config_or_exit
from torchtitan.data.dataloader import build_dataloader, loader_options, resolve_workers
from torchtitan.train import Trainer
from torchtitan.training.semi_sync import fragments


def main() -> None:
    out, methods, groups, sync = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    outer_lr, outer_m = float(sys.argv[5]), float(sys.argv[6])
    trainer = Trainer(load_config_or_exit(sys.argv[7:], int(os.environ["WORLD_SIZE"])))
    params = [p for m in trainer.model_parts for p in m.parameters()]
    start = (
        [p.detach().clone() for p in params],
        copy.deepcopy(trainer.optimizers.optimizers[0].state_dict()),
    )
    result = {
        m: run(trainer, m, groups, sync, outer_lr, outer_m, start) for m in methods.split(",")
    }
    with open(out, "w") as f:
        json.dump(result, f)


def run(trainer, method, groups, sync, outer_lr, outer_m, start) -> list[list[float]]:
    t = trainer.cfg.training
    params = [p for m in trainer.model_parts for p in m.parameters()]
    (adamw,) = trainer.optimizers.optimizers

    def loader(g):
        return iter(
            build_dataloader(
                t,
                trainer.tokenizer,
                g,
                groups,
                trainer.shape.accum_steps,
                workers=resolve_workers(t.dataloader.num_workers, "cpu"),
                options=loader_options(t.dataloader, "cpu"),
            )
        )

    method, _, n = method.partition(":")
    n = int(n or 1)
    if method == "diloco":  # which parameters each fragment holds (indices into params)
        split = fragments(
            trainer.model_parts, SimpleNamespace(num_fragments=n, module_fqns_per_model_fragment=[])
        )
        ids = {id(p): i for i, p in enumerate(params)}
        parts = [[ids[id(p)] for p in f.parameters()] for f in split]
    else:
        parts = [list(range(len(params)))]
    period = sync  # diloco:N: a fragment every SYNC_STEPS steps (sync_steps N x SYNC_STEPS)
    syncs = 0
    data = [loader(g) for g in range(groups)]
    weights = [[w.clone() for w in start[0]] for _ in range(groups)]
    states = [copy.deepcopy(start[1]) for _ in range(groups)]
    global_w = [w.clone() for w in start[0]]
    momentum: dict[int, torch.Tensor] = {}
    losses: list[list[float]] = [[] for _ in range(groups)]
    for step in range(1, t.steps + 1):
        for g in range(groups):
            with torch.no_grad():
                for p, w in zip(params, weights[g]):
                    p.copy_(w)
            adamw.load_state_dict(copy.deepcopy(states[g]))
            batches = [next(data[g]) for _ in range(trainer.shape.accum_steps)]
            result = trainer.train_step(batches, step)
            losses[g].append(trainer.figures(result)[0])
            weights[g] = [p.detach().clone() for p in params]
            states[g] = copy.deepcopy(adamw.state_dict())
        if step % period:
            continue
        frag = parts[syncs % len(parts)]
        syncs += 1
        for i in frag:
            if method == "local_sgd":
                new = sum(w[i] for w in weights) / groups
            else:
                d = sum(global_w[i] - w[i] for w in weights) / groups
                momentum[i] = d.clone() if i not in momentum else outer_m * momentum[i] + d
                global_w[i] = global_w[i] - outer_lr * (d + outer_m * momentum[i])
                new = global_w[i]
            for w in weights:
                w[i] = new.clone()
    return losses


if __name__ == "__main__":
    main()
