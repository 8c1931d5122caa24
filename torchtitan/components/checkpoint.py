"""Checkpoints with torch.distributed.checkpoint (DCP): model, optimizer, LR schedule,
dataloader position and train state (step, tokens seen, RNG states); saved atomically,
resumed automatically, loadable into another parallel layout.

Every state is keyed by what it is, not by who held it: parameters and optimizer moments by
parameter name (DCP reshards DTensors), the data position by global batch row ("slot"),
so FSDP 4 can resume as FSDP 2 x TP 2 or PP 2 x FSDP 2. Only the RNG states are per rank;
they are restored when the world size is unchanged. See checkpoint_files.py for the folder
layout and how a save becomes visible.
"""

import os
import pickle
import random
import shutil
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.stateful import Stateful

from torchtitan.distributed.utils import is_comm_failure
from torchtitan.components.checkpoint_files import (
    CheckpointError,
    CheckpointInfo,
    check_initial_load_path,
    resolve_resume,
    scan,
    step_path,
    write_marker,
)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Optimizer state flattened to one entry per parameter ("state.<fqn>.exp_avg",
# "param_groups.<fqn>.lr"), so it does not depend on how parameters are grouped per rank.
_FLAT = StateDictOptions(flatten_optimizer_state_dict=True, strict=False)


class ModelState(Stateful):
    def __init__(self, model_parts, dtype: torch.dtype | None = None):
        self.model_parts, self.dtype = model_parts, dtype

    def state_dict(self):
        out = {k: v for m in self.model_parts for k, v in get_model_state_dict(m).items()}
        if self.dtype is not None:
            out = {k: v.to(self.dtype) for k, v in out.items()}
        return out

    def load_state_dict(self, state):
        for m in self.model_parts:
            set_model_state_dict(m, state, options=StateDictOptions(strict=False))


class OptimizerState(Stateful):
    def __init__(self, model_parts, optimizers):
        self.model_parts, self.optimizers = model_parts, optimizers

    def state_dict(self):
        out = {}
        for m, o in zip(self.model_parts, self.optimizers.optimizers):
            out.update(get_optimizer_state_dict(m, o, options=_FLAT))
        return out

    def load_state_dict(self, state):
        for m, o in zip(self.model_parts, self.optimizers.optimizers):
            set_optimizer_state_dict(m, o, state, options=_FLAT)


class LRSchedulerState(Stateful):
    """Every part's schedule is the same function of the step: save one, load into all."""

    def __init__(self, optimizers):
        self.schedulers = optimizers.schedulers

    def state_dict(self):
        return self.schedulers[0].state_dict()

    def load_state_dict(self, state):
        for s in self.schedulers:
            s.load_state_dict(state)


class DataloaderState(Stateful):
    """The data position as one pickled record per global batch row ("slot_<i>").

    Checkpoints are taken between steps, when every rank has consumed whole rows, so the
    position is exactly the per-slot stream states; a rank of another layout reads the slots
    it owns there. (Pickled: a stream's nested state changes shape as it advances, which
    DCP's per-key loading would not accept.)"""

    def __init__(self, dataloader):
        self.dataloader = dataloader

    def state_dict(self):
        ds = self.dataloader.state_dict()["dataset_state"]
        assert ds["next_index"] == 0, "checkpoints are taken between steps"
        return {f"slot_{s}": pickle.dumps(st) for s, st in ds["slots"].items()}

    def load_state_dict(self, state):
        loader_state = self.dataloader.state_dict()
        loader_state["dataset_state"] = {
            "next_index": 0, "slots": {k.removeprefix("slot_"): pickle.loads(v) for k, v in state.items()},
        }
        self.dataloader.load_state_dict(loader_state)


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


def _is_main() -> bool:
    return dist.get_rank() == 0


class CheckpointManager:
    """Save and load of one run's checkpoint folder; every method is called on all ranks."""

    def __init__(self, cfg, dump_folder, model_parts, optimizers, dataloader, train_state, run_info: dict):
        self.cfg = cfg
        self.enabled = cfg.enable or cfg.create_seed_checkpoint
        self.folder = os.path.join(dump_folder, cfg.folder)
        self.model_parts = model_parts
        self.states = {
            "model": ModelState(model_parts),
            "optimizer": OptimizerState(model_parts, optimizers),
            "lr_scheduler": LRSchedulerState(optimizers),
            "train_state": train_state,
            "dataloader": DataloaderState(dataloader),
        }
        self.train_state = train_state
        self.run_info = run_info  # world_size, global_batch, model: written into each marker

    # ------------------------------------------------------------------ load

    def load(self) -> str:
        """Restore what this run starts from; return a log line ("" for a fresh start)."""
        info = resolve_resume(self.folder, self.cfg.load_step) if self.cfg.enable else None
        if info is None:
            if not self.cfg.initial_load_path:
                return ""
            check_initial_load_path(self.cfg.initial_load_path)
            self._load({"model": self.states["model"]}, self.cfg.initial_load_path)
            return f"weights loaded from {self.cfg.initial_load_path} (initial_load_path); starting at step 0"
        if info.model_only:
            self._load({"model": self.states["model"]}, info.path, info)
            return f"seed weights loaded from {info.path}; starting at step 0"
        self._check_compatible(info)
        self.train_state.restore_rng = info.marker.get("world_size") == self.run_info["world_size"]
        self._load(self.states, info.path, info)
        self.train_state.restore_rng = True
        rng = "" if info.marker.get("world_size") == self.run_info["world_size"] else (
            f"; RNG states not restored (saved with world size {info.marker.get('world_size')})")
        return f"resumed from step {info.step} ({info.path}){rng}"

    def _check_compatible(self, info: CheckpointInfo) -> None:
        saved = info.marker.get("global_batch")
        if saved is not None and saved != self.run_info["global_batch"]:
            raise CheckpointError(
                f"checkpoint '{info.path}' was saved with global batch {saved} rows, this run has"
                f" {self.run_info['global_batch']}: the data position cannot be carried over; set"
                f" --training.global_batch_size={saved}, or start from its weights only with"
                f" --checkpoint.initial_load_path={info.path} and a fresh --checkpoint.folder"
            )

    def _load(self, states: dict, path: str, info: CheckpointInfo | None = None) -> None:
        try:
            dcp.load(states, checkpoint_id=path)
        except (Exception, CheckpointException) as e:  # DCP raises it on every rank when any read fails
            if is_comm_failure(e):  # a peer died mid-load: not the checkpoint's fault
                raise
            if isinstance(e, CheckpointException):  # its message lists every rank's traceback
                failures = list(e.failures.values())
                e = failures[0][0] if failures else e
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            others = [str(c.step) for c in scan(self.folder) if c.complete and not c.model_only and c.path != path]
            hint = (f"pick an earlier step with --checkpoint.load_step (complete: {', '.join(others)})"
                    if others else "delete it to start fresh")
            raise CheckpointError(f"checkpoint '{path}' could not be loaded, it is corrupt or incompatible"
                                  f" ({type(e).__name__}: {first[:200]}); {hint}") from e

    # ------------------------------------------------------------------ save

    def maybe_save(self, step: int, last: bool) -> None:
        if not self.cfg.enable or not (last or step % self.cfg.interval == 0):
            return
        if last and self.cfg.last_save_model_only:
            dtype = _DTYPES[self.cfg.export_dtype]
            self._save(step, {"model": ModelState(self.model_parts, dtype)}, model_only=True, dtype=self.cfg.export_dtype)
        else:
            self._save(step, self.states, model_only=False)
        self._prune()

    def save_seed(self) -> str:
        self._save(0, {"model": ModelState(self.model_parts)}, model_only=True, dtype="float32")
        return step_path(self.folder, 0)

    def _save(self, step: int, states: dict, model_only: bool, dtype: str = "") -> None:
        """DCP files into step-N.tmp, then the marker, then the rename: the step becomes
        visible only complete, and an existing step-N is replaced only after that."""
        final = step_path(self.folder, step)
        tmp = final + ".tmp"
        if _is_main():
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp)
        dist.barrier()
        dcp.save(states, checkpoint_id=tmp)
        dist.barrier()
        if _is_main():
            write_marker(tmp, {"step": step, "model_only": model_only, "dtype": dtype, "time": time.time(), **self.run_info})
            old = final + ".old"
            if os.path.exists(final):
                os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        dist.barrier()

    def _prune(self) -> None:
        """Delete temporaries a crash left behind, and with keep_latest_k the oldest full
        checkpoints beyond k (seed and weights-only checkpoints stay)."""
        if not _is_main():
            return
        found = scan(self.folder)
        full = [c for c in found if c.complete and not c.model_only]
        newest = full[-1].step if full else -1
        stale = [c for c in found if c.path.endswith(".tmp") and c.step < newest]
        old = full[: -self.cfg.keep_latest_k] if self.cfg.keep_latest_k > 0 else []
        for c in stale + old:
            shutil.rmtree(c.path, ignore_errors=True)
