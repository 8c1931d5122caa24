"""The state a checkpoint holds, each keyed by what it is, not by who held it: parameters and
optimizer moments by parameter name (DCP reshards DTensors into any layout), the LR schedule
once, the data position by global batch row ("slot"), the step and this rank's RNG states."""

import pickle
import random

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful

from torchtitan.models.common.float8 import plain_weights

# Optimizer state flattened to one entry per parameter ("state.<fqn>.exp_avg",
# "param_groups.<fqn>.lr"), so it does not depend on how parameters are grouped per rank.
_FLAT = StateDictOptions(flatten_optimizer_state_dict=True, strict=False)


def _copies(part) -> dict[str, str]:
    """{copy name: parameter name} of the tied copies `part` holds on its own (a pipeline's last
    stage holds the output head that is the first stage's embedding): saved and loaded under
    the parameter's name, so a checkpoint has one name for it in every layout."""
    names = {n for n, _ in part.named_parameters()}
    return {
        c: s for c, s in getattr(part, "tied_weights", {}).items() if c in names and s not in names
    }


def _one_name(state: dict, part) -> dict:
    """A part's model state without the second name of a weight it ties (state_dict lists a
    shared parameter under each module's name)."""
    names = {n for n, _ in part.named_parameters()}
    shared = {c for c, s in getattr(part, "tied_weights", {}).items() if s in names}
    return {k: v for k, v in state.items() if k not in shared} if shared else state


def _rename(key: str, renames: dict[str, str]) -> str:
    """A state key (a parameter name, or "state.<name>.exp_avg" / "param_groups.<name>.lr")
    with a tied copy's name replaced."""
    for old, new in renames.items():
        if key == old:
            return new
        for head in ("state.", "param_groups."):
            if key.startswith(head + old + "."):
                return head + new + key[len(head + old) :]
    return key


def _renamed(state: dict, renames: dict[str, str]) -> dict:
    return {_rename(k, renames): v for k, v in state.items()} if renames else state


def _as_part(state: dict, part) -> dict:
    """Checkpoint keys -> the part's (a copy's values under the copy's name)."""
    back = {s: c for c, s in _copies(part).items()}
    return _renamed(state, back)


class ModelState(Stateful):
    def __init__(self, model_parts, dtype: torch.dtype | None = None):
        self.model_parts, self.dtype = model_parts, dtype

    def state_dict(self):
        out = {
            k: v
            for m in self.model_parts
            for k, v in _renamed(_one_name(get_model_state_dict(m), m), _copies(m)).items()
        }
        out = plain_weights(out)  # float8 all-gather weights: the high-precision tensors
        if self.dtype is not None:
            out = {k: v.to(self.dtype) for k, v in out.items()}
        return out

    def load_state_dict(self, state):
        for m in self.model_parts:
            set_model_state_dict(m, _as_part(state, m), options=StateDictOptions(strict=False))


class OptimizerState(Stateful):
    def __init__(self, model_parts, optimizers):
        self.model_parts, self.optimizers = model_parts, optimizers

    def state_dict(self):
        out = {}
        for m, o in zip(self.model_parts, self.optimizers.optimizers):
            out.update(_renamed(get_optimizer_state_dict(m, o, options=_FLAT), _copies(m)))
        return plain_weights(out)

    def load_state_dict(self, state):
        for m, o in zip(self.model_parts, self.optimizers.optimizers):
            set_optimizer_state_dict(m, o, _as_part(state, m), options=_FLAT)


class LRSchedulerState(Stateful):
    """Every part's schedule is the same function of the step: save one, load into all (each
    scheduler keeps its own base lr: Muon's and AdamW's differ)."""

    def __init__(self, optimizers):
        self.schedulers = optimizers.schedulers

    def state_dict(self):
        return self.schedulers[0].state_dict()

    def load_state_dict(self, state):
        for s in self.schedulers:
            # the step is shared; each keeps its own base lr (Muon's and AdamW's differ)
            own = list(s.base_lrs)
            s.load_state_dict(state)
            s.base_lrs = own
            s._last_lr = [b * f(s.last_epoch) for b, f in zip(own, s.lr_lambdas)]

    def apply(self) -> None:
        """Set every optimizer's lr to its schedule's current value, after a load: a loaded
        optimizer brings the lr saved with it, which must give way to a schedule that starts
        fresh (exclude_from_loading=lr_scheduler); a schedule loaded without the optimizer
        must move the fresh optimizer's lr to the loaded step. After a full load both agree."""
        for s in self.schedulers:
            for group, lr in zip(s.optimizer.param_groups, s.get_last_lr()):
                group["lr"] = lr


class DataloaderState(Stateful):
    """The data position as one pickled record per global batch row ("slot_<i>").

    Checkpoints are taken between steps, when every rank has consumed whole rows, so the
    position is exactly the per-slot stream states; a rank of another layout reads the slots
    it owns there. (Pickled: a stream's nested state changes shape as it advances, which
    DCP's per-key loading would not accept.)"""

    def __init__(self, dataloader):
        self.dataloader = dataloader

    def state_dict(self):
        return {f"slot_{s}": pickle.dumps(st) for s, st in self.dataloader.state_dict().items()}

    def load_state_dict(self, state):
        self.dataloader.load_state_dict(
            {int(k.removeprefix("slot_")): pickle.loads(v) for k, v in state.items()}
        )


class TrainState(Stateful):
    """Step, tokens seen, and this rank's RNG states (torch CPU, CUDA, Python)."""

    def __init__(self, rank: int = 0):
        self.step = 0
        self.tokens_seen = 0
        self.rng_key = f"rng_rank_{rank}"
        self.restore_rng = True

    def state_dict(self):
        out = {"step": torch.tensor(self.step), "tokens_seen": torch.tensor(self.tokens_seen)}
        if self.restore_rng:
            rng = {"torch": torch.get_rng_state(), "python": random.getstate()}
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                rng["cuda"] = torch.cuda.get_rng_state()
            out[self.rng_key] = pickle.dumps(rng)
        return out

    def load_state_dict(self, state):
        self.step, self.tokens_seen = int(state["step"]), int(state["tokens_seen"])
        if self.restore_rng and self.rng_key in state:
            rng = pickle.loads(state[self.rng_key])
            torch.set_rng_state(rng["torch"])
            random.setstate(rng["python"])
            if "cuda" in rng and torch.cuda.is_available():
                torch.cuda.set_rng_state(rng["cuda"])
