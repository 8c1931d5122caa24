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
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.tensor import DTensor

from torchtitan.config.manager import ConfigError

FT = "--fault_tolerance"


def semi_sync_of(cfg) -> str:
    """The job's semi-synchronous method ("" without: every step synchronous, or no FT)."""
    f = cfg.fault_tolerance
    return f.semi_sync_method if f.enable else ""


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
            if isinstance(child, nn.ModuleDict | nn.ModuleList) and len(child):
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


def outer_momentum(opt: torch.optim.Optimizer) -> None:
    """The outer SGD's momentum buffers made now, as zeros: the first sync then computes what
    torch's first step does (0 x momentum + d = d, exactly), and the buffers exist from the
    start, for the checkpoint to load into and the memory to be what every step holds."""
    for group in opt.param_groups:
        if group["momentum"]:
            for p in group["params"]:
                opt.state[p]["momentum_buffer"] = torch.zeros_like(p, requires_grad=False)


def semi_sync(section, manager, model_parts: list[nn.Module], optimizers):
    """torchft's LocalSGD or DiLoCo over `model_parts`, entered: its hooks on `optimizers`
    (training/optimizer.PartOptimizers) sync every sync_steps; leave it with `__exit__`."""
    from torchft.local_sgd import DiLoCo, LocalSGD

    if section.semi_sync_method == "local_sgd":
        wrapper = LocalSGD(manager, nn.ModuleList(model_parts), optimizers, section.sync_steps)
    else:
        frags = fragments(model_parts, section)
        outer = [outer_optimizer(f, section) for f in frags]
        for opt in outer:
            outer_momentum(opt)
        wrapper = DiLoCo(
            manager,
            frags,
            optimizers,
            outer,
            section.sync_steps,
            should_quantize=section.should_quantize,
            fragment_sync_delay=section.fragment_sync_delay,
            fragment_update_alpha=section.fragment_update_alpha,
        )
    return wrapper.__enter__()


class SyncSchedule:
    """torchft's LocalSGD / DiLoCo kept in step with the trainer's step count, so that groups
    that start apart (a whole job resumed, one group restarted) sync at the same steps:

    - where a wrapper is in its period (its local step) is the trainer's step modulo the
      period (a fragment's: sync_steps / num_fragments), set when it starts and after a heal;
    - torchft's step (which decides who heals: a group whose step is behind) is the
      trainer's, set before every quorum: a restarted group is behind the running ones;
    - DiLoCo's fragment of a sync is the number of periods so far modulo the fragments
      (torchft takes its own step modulo the fragments, which is now the trainer's step).
    """

    def __init__(self, section, manager, model_parts, optimizers, train_state):
        self.wrapper = semi_sync(section, manager, model_parts, optimizers)
        self.manager, self.train_state, self.optimizers = manager, train_state, optimizers
        self.diloco = section.semi_sync_method == "diloco"
        self.period = section.sync_steps // (section.num_fragments if self.diloco else 1)
        self.delay = section.fragment_sync_delay if self.diloco else 0
        if self.diloco:
            n = len(self.wrapper._fragments)
            self.wrapper._current_fragment = lambda: (self.train_state.step // self.period) % n
        # every step, before its post-hook's quorum (torchft's own pre-hook only locks state)
        self.handle = optimizers.register_step_pre_hook(lambda *a: self.level())
        self.align()

    def level(self) -> None:
        """torchft's step is the trainer's (before any quorum of this step)."""
        self.manager.load_state_dict(
            {"step": self.train_state.step, "batches_committed": self.manager.batches_committed()}
        )

    def align(self) -> None:
        """The wrapper's place in its period from the trainer's step."""
        self.wrapper._local_step = self.train_state.step % self.period

    def join(self) -> None:
        """This group healed in its first quorum from a peer that is syncing (inside its
        optimizer step of the next step): take part in that sync as the peer does (without a
        quorum of its own: this one is it), then stand where the peer will after its step."""
        if self.diloco:
            fragment = self.wrapper._fragments[self.wrapper._current_fragment()]
            fragment.prepare_sync()
            if self.delay == 0:
                fragment.perform_sync()
        else:
            self.wrapper._perform_sync()
        self.train_state.step += 1  # the peer's step, which this sync ends
        for sched in self.optimizers.schedulers:
            sched.step()
        # after the sync the period starts again (a delayed fragment: its perform is ahead)
        self.wrapper._local_step = self.period - self.delay if self.delay else 0

    def close(self) -> None:
        self.handle.remove()
        self.wrapper.__exit__(None, None, None)


class SemiSyncState(Stateful):
    """What a DiLoCo group's checkpoint holds besides the model and optimizer
    (checkpoint/manager.py, key "semi_sync"): DiLoCo's global weights and outer momentum, by
    parameter name (sharded as the parameter is); where it is in its period follows from
    the step (SyncSchedule). The checkpoint is loaded before the wrapper exists (`attach`
    applies what was loaded)."""

    def __init__(self, model_parts: list[nn.Module]):
        from torchtitan.models.common.init import clean_fqn

        self.names = {
            id(p): clean_fqn(n) for part in model_parts for n, p in part.named_parameters()
        }
        self.params = {clean_fqn(n): p for part in model_parts for n, p in part.named_parameters()}
        self.wrapper = self.loaded = None

    def attach(self, wrapper) -> None:
        self.wrapper = wrapper
        if self.loaded is not None:
            self._apply(self.loaded)
            self.loaded = None

    def _pairs(self):
        """(name, parameter, DiLoCo's global copy, outer momentum) of every synced weight."""
        for frag in self.wrapper._fragments:
            state = frag._outer_optimizer.state
            for name, p in frag._model_fragment.named_parameters():
                momentum = state.get(p, {}).get("momentum_buffer")
                yield self.names[id(p)], p, frag.original_parameters[name], momentum

    def state_dict(self) -> dict:
        out = {}
        if self.wrapper is None:  # a template for the checkpoint to be loaded into
            for name, p in self.params.items():
                out[f"global.{name}"] = torch.zeros_like(p.detach())
                out[f"momentum.{name}"] = torch.zeros_like(p.detach())
            return out
        for name, p, copy, momentum in self._pairs():
            out[f"global.{name}"] = _like(p, copy)
            if momentum is not None:
                out[f"momentum.{name}"] = momentum
        return out

    def load_state_dict(self, state: dict) -> None:
        if self.wrapper is None:
            self.loaded = state
        else:
            self._apply(state)

    def _apply(self, state: dict) -> None:
        with torch.no_grad():
            for name, _, copy, momentum in self._pairs():
                loaded = state[f"global.{name}"]
                copy.copy_(loaded.to_local() if isinstance(loaded, DTensor) else loaded)
                if momentum is not None and f"momentum.{name}" in state:
                    momentum.copy_(state[f"momentum.{name}"])


def _like(p: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """`local` (a host copy of p's local shard) as a tensor sharded as `p` on p's device."""
    local = local.to(p.device)
    if isinstance(p, DTensor):
        return DTensor.from_local(
            local, p.device_mesh, p.placements, run_check=False, shape=p.shape, stride=p.stride()
        )
    return local


class PlannedManager:
    """torchft's Manager as the simulated step needs it (planning/simulate/step.py): one group,
    every sync committed, each all-reduce reported to `on_all_reduce(nbytes)` (the step-time
    model prices it over the groups) and each sync's start to `on_sync()`; so torchft's own
    LocalSGD / DiLoCo code runs in the simulation and its copies are measured."""

    _use_async_quorum = False

    def __init__(self, on_all_reduce=lambda nbytes: None, on_sync=lambda: None):
        self.on_all_reduce, self.on_sync = on_all_reduce, on_sync
        self.step = 0

    def allreduce(self, tensor, should_quantize=False, reduce_op=None):
        self.on_all_reduce(tensor.numel() * tensor.element_size())
        fut = torch.futures.Future()
        fut.set_result([tensor])
        return _Done(fut)

    def start_quorum(self, *args, **kwargs) -> None:
        self.on_sync()  # a sync starts (torchft's wrappers take a quorum first)

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
