"""Semi-synchronous training between replica groups (fault_tolerance.semi_sync_method):
torchft's LocalSGD and DiLoCo wrapped around the trainer's optimizers.

Between synchronisations every group trains alone on its own rows of the global batch (no
gradient crosses groups). Every `sync_steps` steps (torchft counts them in the optimizer's
step hooks) a quorum forms and:

- local_sgd: the weights are averaged over the groups in it;
- diloco: each group's pseudo-gradient (the global weights of the last sync minus its own
  weights now) is averaged, and an outer optimizer (SGD, lr 0.7, momentum 0.9, Nesterov by
  default: the DiLoCo paper's and upstream's) steps the global weights with it; every group
  then continues from the new global weights. With num_fragments > 1 (Streaming DiLoCo) one
  fragment of the model syncs every sync_steps / num_fragments steps.

A step whose sync a group lost is not committed: torchft puts the weights back to the last
global ones (the steps since are discarded, as upstream). A group that restarts heals from a
live peer inside its first sync (the peer's weights, optimizer, schedule, step, and DiLoCo's
global weights and outer momentum).
"""

from __future__ import annotations

import torch
from torch import nn

from torchtitan.config.manager import ConfigError

FT = "--fault_tolerance"


def fragments(model_parts: list[nn.Module], section) -> list[nn.Module]:
    """The model's fragments, each a ModuleList of whole modules of this rank's parts:
    module_fqns_per_model_fragment's names when given, else num_fragments contiguous runs of
    the transformer blocks (the modules before the blocks go with the first, those after
    with the last); one fragment holds every part when num_fragments is 1."""
    n = section.num_fragments
    if n == 1 and not section.module_fqns_per_model_fragment:
        return [nn.ModuleList(model_parts)]
    if section.module_fqns_per_model_fragment:
        out = [_named(model_parts, fqns) for fqns in section.module_fqns_per_model_fragment]
    else:
        out = _split_blocks(model_parts, n)
    _check_cover(model_parts, out)
    return out


def _named(model_parts, fqns: list[str]) -> nn.ModuleList:
    found = nn.ModuleList()
    for fqn in fqns:
        hits = [m for part in model_parts for m in _find(part, fqn)]
        if not hits:
            raise ConfigError(
                f"{FT}.module_fqns_per_model_fragment: no module named {fqn!r} on this rank's"
                " model; name top-level modules (e.g. tok_embeddings, layers.0, norm, output)"
            )
        found.extend(hits)
    return found


def _find(part: nn.Module, fqn: str) -> list[nn.Module]:
    try:
        return [part.get_submodule(fqn)]
    except AttributeError:
        return []


def _split_blocks(model_parts, n: int) -> list[nn.ModuleList]:
    before, blocks, after = [], [], []
    for part in model_parts:
        for child in part.children():
            if isinstance(child, nn.ModuleDict | nn.ModuleList) and len(child) >= n:
                blocks += list(child.children())
            elif not list(child.parameters()):
                continue
            else:
                (after if blocks else before).append(child)
    if len(blocks) < n:
        raise ConfigError(
            f"{FT}.num_fragments={n}: this rank holds {len(blocks)} transformer blocks; use at"
            f" most {len(blocks)} fragments, or name them in {FT}.module_fqns_per_model_fragment"
        )
    out = []
    for i in range(n):
        run = blocks[len(blocks) * i // n : len(blocks) * (i + 1) // n]
        out.append(nn.ModuleList((before if i == 0 else []) + run + (after if i == n - 1 else [])))
    return out


def _check_cover(model_parts, frags: list[nn.ModuleList]) -> None:
    """Every trainable parameter in exactly one fragment (else a weight would never sync, or
    sync twice with two outer updates)."""
    seen: dict[int, int] = {}
    for i, f in enumerate(frags):
        for p in f.parameters():
            if id(p) in seen and seen[id(p)] != i:
                raise ConfigError(
                    f"{FT}.module_fqns_per_model_fragment: fragments {seen[id(p)]} and {i}"
                    " share parameters; give each module to one fragment"
                )
            seen[id(p)] = i
    missing = [
        name
        for part in model_parts
        for name, p in part.named_parameters()
        if p.requires_grad and id(p) not in seen
    ]
    if missing:
        raise ConfigError(
            f"{FT}.module_fqns_per_model_fragment: {len(missing)} parameters in no fragment"
            f" (e.g. {missing[0]}); name every top-level module in one fragment"
        )


def outer_optimizer(fragment: nn.Module, section) -> torch.optim.Optimizer:
    """DiLoCo's outer optimizer of one fragment: SGD with the [fault_tolerance] outer keys."""
    return torch.optim.SGD(
        list(fragment.parameters()),
        lr=section.outer_lr,
        momentum=section.outer_momentum,
        nesterov=section.outer_nesterov,
    )


def semi_sync(section, manager, model_parts: list[nn.Module], optimizers):
    """torchft's LocalSGD or DiLoCo over `model_parts`, entered: its hooks on `optimizers`
    (training/optimizer.PartOptimizers) sync every sync_steps; leave it with `__exit__`."""
    from torchft.local_sgd import DiLoCo, LocalSGD

    if section.semi_sync_method == "local_sgd":
        wrapper = LocalSGD(manager, nn.ModuleList(model_parts), optimizers, section.sync_steps)
    else:
        frags = fragments(model_parts, section)
        wrapper = DiLoCo(
            manager,
            frags,
            optimizers,
            [outer_optimizer(f, section) for f in frags],
            section.sync_steps,
            should_quantize=section.should_quantize,
            fragment_sync_delay=section.fragment_sync_delay,
            fragment_update_alpha=section.fragment_update_alpha,
        )
    return wrapper.__enter__()


class PlannedManager:
    """torchft's Manager as the simulated step needs it (planning/simulate/step.py): one group,
    every sync committed, each all-reduce reported to `on_all_reduce(nbytes)` (the step-time
    model prices it over the groups); so torchft's own LocalSGD / DiLoCo code runs in the
    simulation and its copies are measured."""

    _use_async_quorum = False

    def __init__(self, on_all_reduce=lambda nbytes: None):
        self.on_all_reduce = on_all_reduce
        self.step = 0

    def allreduce(self, tensor, should_quantize=False, reduce_op=None):
        self.on_all_reduce(tensor.numel() * tensor.element_size())
        fut = torch.futures.Future()
        fut.set_result([tensor])
        return _Done(fut)

    def start_quorum(self, *args, **kwargs) -> None:
        pass

    def should_commit(self, *args, **kwargs) -> bool:
        self.step += 1
        return True

    def current_step(self) -> int:
        return self.step

    def register_state_dict_fn(self, *args) -> None:
        pass

    def allow_state_dict_read(self) -> None:
        pass

    def disallow_state_dict_read(self) -> None:
        pass


class _Done:
    def __init__(self, fut):
        self.fut = fut

    def wait(self, *args) -> bool:
        return True

    def get_future(self):
        return self.fut
