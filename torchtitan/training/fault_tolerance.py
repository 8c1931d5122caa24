"""Replica-group fault tolerance with torchft ([fault_tolerance]).

A job of G replica groups is G launches (scripts/ft_local.py starts them on one machine,
docs/reliability.md on a cluster), each its own torchrun of the same layout: the replicate
dimension is the groups. A lighthouse (torchft's) forms a quorum of the groups alive at
every step, and each step here runs:

1. `begin_step`: the quorum (synchronous: no step starts before it). A group behind the
   others (restarted, or joining) gets model, optimizer, lr schedule and step from a live
   peer's ranks of the same group rank (torchft's HTTP checkpoint transport, plain local
   shards: every group has the same layout, so shard i is shard i) and loads them: its
   weights are then bitwise the peer's.
2. the group's forward/backward (its own gradient reductions, as without FT);
3. `average`: every local gradient and the step's loss sums averaged over the groups in the
   quorum on torchft's process group, in buckets of at most 64 MiB (a larger gradient in
   place) one after another (the same rank of every group holds the same shard), so with
   every group alive the step is HSDP's over groups x the group's data-parallel ranks;
4. `commit`: torchft's vote; a step that a group lost during it is not committed anywhere
   and is trained again with the next batches.

Nothing of the group's own mesh changes: FSDP2, SimpleFSDP, TP, PP, CP and EP inside a group
work as without FT (the averaging follows the local shards, whatever they are).

With semi_sync_method (LocalSGD, DiLoCo: training/semi_sync.py) no step averages gradients:
the groups meet in a quorum only every sync_steps, inside the optimizer's step (torchft's
hooks), where a group behind heals; a fresh job's groups still meet once before step 1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import pickle
import threading
import time
import warnings
from datetime import timedelta

import torch
from torch.distributed.tensor import DTensor

from torchtitan.checkpoint.states import LRSchedulerState, ModelState, OptimizerState
from torchtitan.training.semi_sync import SyncSchedule, semi_sync

logger = logging.getLogger(__name__)

REPLICA_PREFIX = "torchtitan_ft_"  # torchft replica ids: this prefix and the replica_id
LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"  # where torchft's manager finds the lighthouse
STARTUP_WAIT_S = 60.0  # a group's first quorum waits this long for every group to join
STARTUP_POLL_S = 0.5
SEMI_RESTART_WAIT_S = 1800.0  # ... semi-synchronous, resumed, without a predicted step time
BUCKET_BYTES = 64 * 2**20  # gradients averaged together in one all-reduce, at most


def _local(state: dict) -> dict:
    """A state dict with each DTensor as its local shard (what is sent to a healing peer)."""
    return {k: v.to_local() if isinstance(v, DTensor) else v for k, v in state.items()}


def _as_own(received: dict, own: dict) -> dict:
    """Received local shards as DTensors of this rank's own layout (the same as the sender's)."""
    out = {}
    for k, v in received.items():
        mine = own.get(k)
        if isinstance(mine, DTensor):
            v = DTensor.from_local(
                v.to(mine.device),
                mine.device_mesh,
                mine.placements,
                run_check=False,
                shape=mine.shape,
                stride=mine.stride(),
            )
        out[k] = v
    return out


def digest(model_parts) -> str:
    """16 hex digits of SHA-256 over this rank's local parameter shards in name order: two
    groups' same ranks hold bitwise the same weights exactly when their digests agree."""
    h = hashlib.sha256()
    for m in model_parts:
        for name, p in sorted(m.named_parameters()):
            t = p.to_local() if isinstance(p, DTensor) else p
            h.update(name.encode())
            h.update(t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def buckets(tensors: list[torch.Tensor], cap: int | None = None) -> list[list[torch.Tensor]]:
    """`tensors` in all-reduce buckets: of one dtype each, in order, up to `cap` bytes
    (BUCKET_BYTES); a tensor of `cap` bytes or more is a bucket of its own, averaged in place
    (no copy)."""
    cap = BUCKET_BYTES if cap is None else cap
    out: list[list[torch.Tensor]] = []
    open_: dict[torch.dtype, tuple[list, int]] = {}
    for t in tensors:
        size = t.numel() * t.element_size()
        if size >= cap:
            out.append([t])
            continue
        bucket, used = open_.get(t.dtype, ([], 0))
        if bucket and used + size > cap:
            out.append(bucket)
            bucket, used = [], 0
        open_[t.dtype] = (bucket + [t], used + size)
    out += [bucket for bucket, _ in open_.values() if bucket]
    return out


def in_buckets(params, sums, reduce) -> None:
    """`reduce(flat)` in place on every local gradient of `params` and the loss sums, bucket
    by bucket (buckets()), one at a time: a bucket's copy is the only memory it takes."""
    tensors = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad for p in params]
    tensors = [t for t in tensors if t is not None]
    tensors += [sums.main, sums.aux, sums.mtp]
    for bucket in buckets(tensors):
        alone = len(bucket) == 1 and bucket[0].is_contiguous()
        flat = bucket[0] if alone else torch.cat([t.reshape(-1) for t in bucket])
        reduce(flat)
        if not alone:
            at = 0
            for t in bucket:
                t.copy_(flat[at : at + t.numel()].view_as(t))
                at += t.numel()


class PlannedReplicaGroups:
    """The replica groups in a simulated step (planning/simulate/step.py), so that the memory
    and step-time predictions hold what they add: the same buckets and copies as
    ReplicaGroups.average, or (semi-synchronous) torchft's own LocalSGD / DiLoCo on a stand-in
    manager (semi_sync.PlannedManager), syncing in every simulated step (its copies are at
    their largest then) with DiLoCo's outer momentum (alive from the start). `trace`: the
    step-time trace (planning/step_time/trace.OpTrace; None: memory only), told each
    all-reduce over the groups, and whose `share` is 1 / (steps between syncs) while a sync
    runs (its ops and all-reduces count for the average step); every step committed."""

    def __init__(self, section, model_parts, optimizers, trace=None, where=None):
        from torchtitan.training.semi_sync import PlannedManager

        self.semi, self.trace, self.where = section.semi_sync_method, trace, where
        self.outer = None
        if self.semi:
            every = section.sync_steps // section.num_fragments  # one fragment's sync interval
            planned = dataclasses.replace(
                section, sync_steps=section.num_fragments, fragment_sync_delay=0
            )

            def sync_starts() -> None:
                if trace is not None:
                    trace.share = 1 / every

            manager = PlannedManager(self._all_reduce, on_sync=sync_starts)
            self.outer = semi_sync(planned, manager, model_parts, optimizers)

    def _all_reduce(self, nbytes: int) -> None:
        if self.trace is not None:
            self.trace.replica_groups_all_reduce(nbytes, self.where)

    def host_copies(self) -> list[torch.Tensor]:
        """DiLoCo's copy of the global weights (torchft keeps it in host memory)."""
        frags = getattr(self.outer, "_fragments", [])
        return [t for f in frags for t in f.original_parameters.values()]

    def outer_states(self) -> list[torch.Tensor]:
        """DiLoCo's outer momentum (made with the wrapper: semi_sync.outer_momentum)."""
        return [
            s["momentum_buffer"]
            for f in getattr(self.outer, "_fragments", [])
            for s in f._outer_optimizer.state.values()
        ]

    def average(self, params, sums) -> None:
        if not self.semi:
            in_buckets(params, sums, lambda flat: self._all_reduce(flat.nbytes))

    @contextlib.contextmanager
    def stepping(self):
        try:
            yield
        finally:  # the sync (inside the optimizers' step) is over
            if self.trace is not None:
                self.trace.share = 1.0

    def commit(self) -> bool:
        return True


class ReplicaGroups:
    """This rank's part of the replica groups (module docstring); `section`: [fault_tolerance]."""

    def __init__(
        self,
        section,
        *,
        model_parts,
        optimizers,
        train_state,
        dataloader=None,
        positions: DataPositions | None = None,
        log=logger.info,
        paused=lambda activity: contextlib.nullcontext(),
        semi_state=None,
        step_seconds: float | None = None,
    ):
        """`paused(activity)`: a context in which the hang watchdog is paused (waiting for
        another group, in the quorum or the groups' collectives, is torchft's business: a
        lost group costs a timeout there, never a hang report). `positions`: this group's
        data positions (checkpoint.enable_ft_dataloader_checkpoints), of `dataloader`.
        `semi_state`: semi-synchronous, the checkpoint's part (semi_sync.SemiSyncState).
        `step_seconds`: the predicted step time (how long a resumed semi-synchronous group
        waits for a running one's sync: 3 sync periods, at least STARTUP_WAIT_S)."""
        # torchft's Rust side logs every quorum and commit at INFO: its warnings are enough
        os.environ.setdefault("RUST_LOG", "warn")
        import torchft
        from torchft.process_group import ProcessGroupGloo, ProcessGroupNCCL

        # a warning per quorum about NCCL's flight recorder, on every backend (ERROR stays)
        logging.getLogger("torchft.manager").setLevel(logging.ERROR)
        # torchft reads a received checkpoint from a read-only buffer (its tensors are copied
        # into this rank's own at once)
        warnings.filterwarnings("ignore", message="The given buffer is not writable")

        timeout = timedelta(milliseconds=section.process_group_timeout_ms)
        pg = (
            ProcessGroupNCCL(timeout=timeout)
            if section.process_group == "nccl"
            else ProcessGroupGloo(timeout=timeout)
        )
        self.section, self.log, self.paused = section, log, paused
        self.model_parts, self.train_state = model_parts, train_state
        self.optimizers = optimizers
        self.dataloader, self.positions = dataloader, positions
        self.model = ModelState(model_parts)
        self.optim = OptimizerState(model_parts, optimizers)
        self.lr = LRSchedulerState(optimizers)
        self.healed_from: int | None = None  # the step a heal brought this group to
        self.first = True  # the group's first quorum (begin_step)
        self.semi = section.semi_sync_method  # "" (every step averaged), local_sgd, diloco
        self.restart_wait_s = (
            max(STARTUP_WAIT_S, 3 * section.sync_steps * step_seconds)
            if step_seconds
            else SEMI_RESTART_WAIT_S
        )
        self.manager = torchft.Manager(
            pg=pg,
            load_state_dict=self._load,
            state_dict=self._state,
            min_replica_size=section.min_replica_size,
            use_async_quorum=False,  # no step before its quorum: a healed group trains at once
            replica_id=f"{REPLICA_PREFIX}{section.replica_id}",
            timeout=timeout,
            quorum_timeout=max(timeout, timedelta(seconds=60)),
            # a group that starts late takes the weights of those running; semi-synchronous,
            # the first sync is still torchft's step 0 (it counts syncs), where init_sync would
            # heal every group but one: their weights are equal already (one seed)
            init_sync=not section.semi_sync_method,
        )
        # a job resumed from a checkpoint: its groups start at the checkpoint's step, level
        self.manager.load_state_dict({"step": train_state.step, "batches_committed": 0})
        self.resumed = self.resume_data() or train_state.step > 0
        # LocalSGD / DiLoCo: torchft's own, hooked on the optimizers' step
        self.outer = None
        if self.semi:
            self.outer = SyncSchedule(section, self.manager, model_parts, optimizers, train_state)
            if semi_state is not None:
                semi_state.attach(self.outer.wrapper)

    # ------------------------------------------------------------------ healing

    def _state(self) -> dict:
        """What a healing peer gets (called on torchft's quorum thread while this rank waits
        for the quorum, between two steps)."""
        state = {
            "model": _local(self.model.state_dict()),
            "lr_scheduler": self.lr.state_dict(),
            "step": self.train_state.step,
            "tokens_seen": self.train_state.tokens_seen,
        }
        # before the first step an optimizer holds no state, and torch's state-dict reader
        # would create it with a step of zero gradients (AdamW's step count then off by one)
        if any(o.state for o in self.optimizers.optimizers):
            state["optimizer"] = _local(self.optim.state_dict())
        self.log(
            f"[torchtitan] fault tolerance: sending step {self.train_state.step} to a healing"
            f" replica group (weights digest {digest(self.model_parts)})"
        )
        return state

    def _load(self, state: dict) -> None:
        if "optimizer" in state:
            self.optim.load_state_dict(_as_own(state["optimizer"], self.optim.state_dict()))
        self.model.load_state_dict(_as_own(state["model"], self.model.state_dict()))
        self.lr.load_state_dict(state["lr_scheduler"])
        self.lr.apply()
        self.train_state.step = int(state["step"])
        self.train_state.tokens_seen = int(state["tokens_seen"])
        self.healed_from = self.train_state.step
        self.log(
            f"[torchtitan] fault tolerance: healed from a live replica group at step"
            f" {self.train_state.step} (weights digest {digest(self.model_parts)})"
        )

    # ------------------------------------------------------------------ one step

    def begin_step(self) -> bool:
        """The quorum of this step (a group behind heals inside it); True when this group
        healed (its step, weights and data position moved: the caller reads its data anew).
        A group's first quorum waits (up to STARTUP_WAIT_S) for every group to be in it: the
        groups of a job start at different moments, and the first to come would otherwise
        train alone (and the others heal to its step), where a job of every group trains as
        HSDP."""
        self.healed_from = None
        if self.semi and not self.first:
            return False  # semi-synchronous: the later quorums are the syncs (in the hooks)
        with self.paused("the replica groups' quorum"):
            self._quorum()
        if self.healed_from is None:
            return False
        if self.semi:  # the peer it healed from is syncing: take part, then go on from there
            with self.paused(f"the replica groups' sync ({self.semi})"):
                self.outer.join()
            self.healed_from = None  # its step is the peer's now (step_number: nothing to move)
        self.resume_data()
        return True

    def _quorum(self) -> None:
        wait = STARTUP_WAIT_S
        if self.semi:
            self.outer.level()
            # semi-synchronous, a group that resumes or restarts meets the running ones at
            # their next sync, up to a sync period away
            if self.resumed:
                wait = self.restart_wait_s
                self.log(
                    "[torchtitan] fault tolerance: waiting for the other replica groups (a"
                    f" running one's next sync; up to {wait:.0f} s, then alone)"
                )
        self.manager.start_quorum()
        if self.first:
            self.first = False
            # a count of tries, not a clock: every rank of the group sees the same quorums
            # and must leave the loop at the same one (each start_quorum is collective)
            for _ in range(int(wait / STARTUP_POLL_S)):
                if self.participants >= self.section.group_size:
                    break
                time.sleep(STARTUP_POLL_S)
                self.manager.start_quorum()

    @property
    def participants(self) -> int:
        """Replica groups in this step's quorum (semi-synchronous: in the last sync's; every
        group before the first)."""
        return self.manager.num_participants() or self.section.group_size

    @property
    def writes_checkpoints(self) -> bool:
        """The full checkpoint is written by one group: the lowest in the quorum; semi-
        synchronous, every group writes its own (they differ between syncs)."""
        return bool(self.semi) or self.manager.participating_rank() == 0

    def average(self, params, sums) -> None:
        """Every local gradient of `params` and the loss sums (`sums`: training/step.StepSums)
        averaged over the groups in the quorum (in_buckets)."""

        def all_reduce(flat: torch.Tensor) -> None:
            with self.paused("the average over the replica groups"):
                self.manager.allreduce(flat).wait()

        if not self.semi:
            in_buckets(params, sums, all_reduce)

    def stepping(self):
        """The context of the optimizers' step: semi-synchronous, a sync (a quorum, the
        groups' all-reduce) may run in it, which the hang watchdog leaves to torchft."""
        if self.semi:
            return self.paused(f"the replica groups' sync ({self.semi})")
        return contextlib.nullcontext()

    def step_number(self, step: int) -> int:
        """The number of the step just trained as `step`: semi-synchronous, a heal inside its
        sync moved this group to its peer's step (the peer was training the next one)."""
        return step if self.healed_from is None else self.healed_from + 1

    def resume_data(self) -> bool:
        """This group's own data position of the current step (its files), if it has one
        (True then)."""
        if self.positions is None:
            return False
        saved = self.positions.load(self.train_state.step)
        if saved is None:
            return False
        self.dataloader.load_state_dict(saved["data"])
        self.log(
            f"[torchtitan] fault tolerance: data position of replica group"
            f" {self.section.replica_id} after its step {saved['step']}"
        )
        return True

    def after_step(self, step: int, checkpointed: bool) -> None:
        """A committed step: this group's data position written (in the background; also as
        the step's own when a checkpoint is written after it)."""
        if self.positions is not None:
            self.positions.save(step, self.dataloader.state_dict(), checkpointed)

    def tokens_of_step(self, tokens: int) -> int:
        """Of a step's global batch `tokens`, those of the groups that took part."""
        return tokens * self.participants // self.section.group_size

    def commit(self) -> bool:
        """torchft's vote: True when every group in the quorum finished the step (semi-
        synchronous: every step is the group's own; the syncs vote inside the optimizer step)."""
        if self.semi:
            return True
        with self.paused("the replica groups' commit vote"):
            return self.manager.should_commit()

    def close(self) -> None:
        if self.outer is not None:
            self.outer.close()
        if self.positions is not None:
            self.positions.wait()
        self.manager.shutdown(wait=False)


class DataPositions:
    """Each replica group's data position in small files of its own, written after every
    step in the background (`<dump_folder>/ft/replica_<id>/rank_<r>/`): `latest`, and the
    steps a full checkpoint is written at. A group that restarts resumes its data from them
    (the full checkpoint, written by one group, holds no data position under FT)."""

    def __init__(self, dump_folder: str, replica_id: int, rank: int):
        self.folder = os.path.join(dump_folder, "ft", f"replica_{replica_id}", f"rank_{rank}")
        self.thread: threading.Thread | None = None

    def _path(self, name: str) -> str:
        return os.path.join(self.folder, f"{name}.pkl")

    def save(self, step: int, state: dict, also_as_step: bool) -> None:
        """Write `state` (a loader's state_dict) for `step` without waiting for the disk."""
        self.wait()
        record = pickle.dumps({"step": step, "data": state})

        def write() -> None:
            os.makedirs(self.folder, exist_ok=True)
            names = ["latest"] + ([f"step_{step}"] if also_as_step else [])
            for name in names:
                tmp = self._path(name) + ".tmp"
                with open(tmp, "wb") as f:
                    f.write(record)
                os.replace(tmp, self._path(name))  # a reader never sees half a file

        self.thread = threading.Thread(target=write, name="ft-data-position", daemon=True)
        self.thread.start()

    def wait(self) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None

    def load(self, step: int) -> dict | None:
        """The position saved at `step` if there is one, else the latest (a group that
        restarts after the others went on resumes its own data where it stopped); None
        when this group never saved one."""
        for name in (f"step_{step}", "latest"):
            if os.path.exists(self._path(name)):
                with open(self._path(name), "rb") as f:
                    return pickle.load(f)
        return None
