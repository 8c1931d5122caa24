"""Checkpoints with torch.distributed.checkpoint (DCP): model, optimizer, LR schedule,
dataloader position and train state; saved atomically, resumed automatically.

A step's checkpoint is written to `step-N.tmp`, completed with a marker file, then renamed
to `step-N`; only folders holding the marker are ever loaded, so a crash mid-save leaves the
previous checkpoint as the latest good one.
"""

import os
import pickle
import re
import shutil

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful

COMPLETE_MARKER = ".complete"
_STEP_DIR = re.compile(r"^step-(\d+)$")


class ModelState(Stateful):
    def __init__(self, model_parts):
        self.model_parts = model_parts

    def state_dict(self):
        return {k: v for m in self.model_parts for k, v in get_model_state_dict(m).items()}

    def load_state_dict(self, state):
        for m in self.model_parts:
            set_model_state_dict(m, state, options=_non_strict())


class OptimizerState(Stateful):
    def __init__(self, model_parts, optimizer):
        self.model_parts, self.optimizer = model_parts, optimizer

    def state_dict(self):
        out = {}
        for m in self.model_parts:
            out.update(get_optimizer_state_dict(m, self.optimizer))
        return out

    def load_state_dict(self, state):
        for m in self.model_parts:
            set_optimizer_state_dict(m, self.optimizer, state, options=_non_strict())


class DataloaderState(Stateful):
    """Each data-parallel rank keeps its own dataloader position under its own key, as one
    pickled blob: its nested structure changes while iterating, which DCP's per-key
    loading would not accept."""

    def __init__(self, dataloader, dp_rank: int):
        self.dataloader, self.key = dataloader, f"dp_rank_{dp_rank}"

    def state_dict(self):
        return {self.key: pickle.dumps(self.dataloader.state_dict())}

    def load_state_dict(self, state):
        self.dataloader.load_state_dict(pickle.loads(state[self.key]))


def _non_strict():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(strict=False)


class TrainState(Stateful):
    def __init__(self):
        self.step = 0
        self.tokens_seen = 0

    def state_dict(self):
        return {"step": torch.tensor(self.step), "tokens_seen": torch.tensor(self.tokens_seen)}

    def load_state_dict(self, state):
        self.step, self.tokens_seen = int(state["step"]), int(state["tokens_seen"])


def completed_steps(folder: str) -> list[int]:
    if not os.path.isdir(folder):
        return []
    steps = []
    for name in os.listdir(folder):
        m = _STEP_DIR.match(name)
        if m and os.path.exists(os.path.join(folder, name, COMPLETE_MARKER)):
            steps.append(int(m.group(1)))
    return sorted(steps)


class CheckpointManager:
    def __init__(self, cfg, dump_folder, model_parts, optimizer, lr_scheduler, dataloader, train_state, dp_rank):
        self.enabled = cfg.enable
        self.interval = cfg.interval
        self.folder = os.path.join(dump_folder, cfg.folder)
        self.states = {
            "model": ModelState(model_parts),
            "optimizer": OptimizerState(model_parts, optimizer),
            "lr_scheduler": lr_scheduler,
            "train_state": train_state,
        }
        self.dataloader, self.dp_rank = dataloader, dp_rank

    def _all_states(self) -> dict:
        return {**self.states, "dataloader": DataloaderState(self.dataloader, self.dp_rank)}

    def load_latest(self) -> int:
        """Load the newest complete checkpoint; return its step (0 when there is none)."""
        steps = completed_steps(self.folder) if self.enabled else []
        if not steps:
            return 0
        path = os.path.join(self.folder, f"step-{steps[-1]}")
        dcp.load(self._all_states(), checkpoint_id=path)
        return steps[-1]

    def maybe_save(self, step: int, last: bool) -> None:
        if not self.enabled or not (last or step % self.interval == 0):
            return
        final = os.path.join(self.folder, f"step-{step}")
        tmp = final + ".tmp"
        if dist.get_rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp, exist_ok=True)
        dist.barrier()
        dcp.save(self._all_states(), checkpoint_id=tmp)
        dist.barrier()
        if dist.get_rank() == 0:
            open(os.path.join(tmp, COMPLETE_MARKER), "w").close()
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
        dist.barrier()
