"""Checkpoints with torch.distributed.checkpoint (DCP): model, optimizer, LR schedule,
dataloader position and train state (step, tokens seen, RNG states); saved atomically,
resumed automatically, loadable into another parallel layout.

Every state is keyed by what it is, not by who held it: parameters and optimizer moments by
parameter name (DCP reshards DTensors), the data position by global batch row ("slot"),
so FSDP 4 can resume as FSDP 2 x TP 2 or PP 2 x FSDP 2. Only the RNG states are per rank;
they are restored when the layout is unchanged (states.py). See files.py for the folder
layout and how a save becomes visible.

Upstream's [checkpoint] keys act here as there: exclude_from_loading leaves parts of a full
checkpoint fresh, initial_load_model_only=false starts from another run's full checkpoint,
load_only never saves, enable_first_step_checkpoint also saves after step 1. Where upstream
writes last_save_in_hf's folder in place of step-N, this trainer writes it beside the
checkpoints (<dump_folder>/hf/step-N) and names it in step-N's marker.
Under fault tolerance (torchft replica groups) one group writes the checkpoints and no data
position is in them: each group keeps its own (training/fault_tolerance.DataPositions).
"""

import logging
import os
import shutil
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from torchtitan.checkpoint.async_saves import AsyncSaves
from torchtitan.checkpoint.files import (
    LOADABLE_PARTS,
    CheckpointError,
    hf_export_path,
    marker_record,
    newest_first,
    scan,
    start_point,
    step_path,
    write_marker,
)
from torchtitan.checkpoint.states import (
    DataloaderState,
    LRSchedulerState,
    ModelState,
    OptimizerState,
)
from torchtitan.data.dataloader import StateVersionError
from torchtitan.distributed.process_groups import is_comm_failure
from torchtitan.dtypes import DTYPES
from torchtitan.models.hf.weights import HFSpec, export_hf, load_hf_weights
from torchtitan.resilience import faults
from torchtitan.units import MIB

logger = logging.getLogger(__name__)

# async_mode values that write in the background; pinned staging is what CUDA does in both
# (async_saves.py), so they differ only in name
ASYNC_MODES = ("async", "async_with_pinned_mem")


def _is_main() -> bool:
    return dist.get_rank() == 0


class _Writer(dcp.FileSystemWriter):
    """DCP's file writer, with the fault-injection point of the failure tests (faults.py)."""

    def __init__(self, path: str, step: int):
        super().__init__(path)
        self.step = step

    def write_data(self, plan, planner):
        faults.point("checkpoint_write", self.step)
        return super().write_data(plan, planner)


class CheckpointManager:
    """Save and load of one run's checkpoint folder; every method is called on all ranks.

    Checkpoint I/O synchronises over its own gloo group (created at the first save or load)
    whose timeout is [comm] checkpoint_timeout_seconds: writing a large checkpoint to a slow
    file system can take longer than a training collective may wait. Rank 0 alone decides which checkpoint
    to load and renames folders; the folder must be on a file system all ranks share.
    """

    def __init__(
        self,
        cfg,
        dump_folder,
        model_parts,
        run_info: dict,
        *,
        optimizers=None,
        dataloader=None,
        train_state=None,
        io_timeout_seconds: int = 1800,
        hf: HFSpec | None = None,
        device_type: str = "cpu",
        log=lambda line: None,
        hf_assets_path: str = "",
        extra_states: dict | None = None,
    ):
        """`run_info`: what every marker records (files.run_record). The training state
        (optimizers, dataloader, train_state) is what a full checkpoint holds besides the model;
        without it (a seed checkpoint) only the model is saved. `hf_assets_path`: the folder
        initial_load_in_hf reads when initial_load_path is empty (upstream's fallback)."""
        self.cfg = cfg
        self.hf_assets_path = hf_assets_path
        self.folder = os.path.join(dump_folder, cfg.folder)
        self.dump_folder = dump_folder
        self.hf = hf
        self.model_parts = model_parts
        self.states = {"model": ModelState(model_parts)}
        if optimizers is not None:
            self.states.update(
                {
                    "optimizer": OptimizerState(model_parts, optimizers),
                    "lr_scheduler": LRSchedulerState(optimizers),
                    "train_state": train_state,
                }
            )
            if dataloader is not None:  # fault tolerance: each group keeps its own (ft/)
                self.states["dataloader"] = DataloaderState(dataloader)
            # semi-synchronous fault tolerance: "semi_sync" (training/semi_sync.SemiSyncState)
            self.states.update(extra_states or {})
        self.train_state = train_state
        self.run_info = run_info  # world_size, global_batch, model, mesh: written into each marker
        self._io_timeout = timedelta(seconds=io_timeout_seconds)
        self._pg = None
        self._deleting: threading.Thread | None = None
        self.async_saves = (
            AsyncSaves(device_type, io_timeout_seconds) if cfg.async_mode in ASYNC_MODES else None
        )
        self.saved_step = -1  # the step of the newest save this run started (sync or async)
        self.save_s = 0.0  # the longest synchronous save so far
        self.log = log  # rank 0's console (a line per save)
        if cfg.enable and cfg.async_mode == "async_with_pinned_mem" and device_type != "cuda":
            self.log(
                f"[torchtitan] checkpoint.async_mode=async_with_pinned_mem: pinned memory is CUDA's;"
                f" on {device_type} the saves are async, staged in ordinary host memory"
            )

    @property
    def pg(self):
        """The checkpoint I/O group, created at the first save or load (every rank reaches it
        at the same point): a run that neither saves nor loads never depends on gloo reaching
        every node."""
        if self._pg is None:
            self._pg = dist.new_group(backend="gloo", timeout=self._io_timeout)
        return self._pg

    def _barrier(self) -> None:
        dist.barrier(group=self.pg)

    def _agree(self, fn):
        """Run fn on rank 0 and hand its result (or its CheckpointError) to every rank, so
        all ranks act on one view of the folder (file system caches may differ per node)."""
        box = [None]
        if _is_main():
            try:
                box[0] = ("ok", fn())
            except CheckpointError as e:
                box[0] = ("error", str(e))
        dist.broadcast_object_list(box, src=0, group=self.pg)
        kind, value = box[0]
        if kind == "error":
            raise CheckpointError(value)
        return value

    # ------------------------------------------------------------------ load

    def load(self) -> str:
        """Restore what this run starts from (files.start_point, decided on rank 0 for every
        rank); return a log line ("" for a fresh start)."""
        c, spec = self.cfg, self.hf
        if not (c.enable or c.initial_load_path or (c.initial_load_in_hf and self.hf_assets_path)):
            return ""  # nothing to look at: no checkpoint group is made
        model_name, flavor = self.run_info["model"].split("/", 1)
        args = spec.args if spec is not None else None
        start = self._agree(
            lambda: start_point(
                self.folder,
                c,
                model_name,
                flavor=flavor,
                args=args,
                global_batch=self.run_info.get("global_batch"),
                hf_assets_path=self.hf_assets_path,
            )
        )
        if start.kind == "fresh":
            return ""
        if start.kind == "initial_hf":
            done = load_hf_weights(
                self.model_parts, start.path, spec.model_name, spec.args, key=start.key
            )
            note = f"; {done.note}" if done.note else ""
            return (
                f"weights loaded from Hugging Face folder {start.path} ({done.tensors} tensors,"
                f" {done.bytes_read / MIB:.2f} MiB read on this rank){note}; starting at step 0"
            )
        if start.kind == "initial_checkpoint":
            self._load({"model": self.states["model"]}, start.path, own=False)
            return f"weights loaded from {start.path} (initial_load_path); starting at step 0"
        if start.kind == "seed":
            self._load({"model": self.states["model"]}, start.path)
            return f"seed weights loaded from {start.path}; starting at step 0"
        return self._load_full(start.info, own=start.kind == "resume")

    def _load_full(self, info, own: bool) -> str:
        """A full checkpoint - this run's, or another run's (initial_load_model_only=false) -
        without the parts in exclude_from_loading, which start fresh; the log line."""
        skipped = [k for k in LOADABLE_PARTS if k in self.cfg.exclude_from_loading]
        states = {k: v for k, v in self.states.items() if k not in skipped}
        if "semi_sync" in states and not _holds(info.path, "semi_sync"):
            del states["semi_sync"]  # written without semi-synchronous training: it starts here
        # Per-rank RNG states mean something only for the same rank layout.
        same_layout = (info.marker.get("world_size"), info.marker.get("mesh")) == (
            self.run_info["world_size"],
            self.run_info["mesh"],
        )
        self.train_state.restore_rng = same_layout
        try:
            self._load(states, info.path, own=own)
        finally:
            self.train_state.restore_rng = True
        self.states["lr_scheduler"].apply()  # the schedule, loaded or fresh, sets the lr
        where = info.path if own else f"{info.path}, initial_load_path"
        line = f"resumed from step {info.step} ({where})"
        if "train_state" not in skipped and not same_layout:
            line += (
                f"; RNG states not restored (saved by mesh {info.marker.get('mesh')},"
                f" world size {info.marker.get('world_size')})"
            )
        if skipped:
            fresh = [f"{k} (starting at step 0)" if k == "train_state" else k for k in skipped]
            line += f"; not loaded, starting fresh: {', '.join(fresh)}"
        return line

    def _load(self, states: dict, path: str, own: bool = True) -> None:
        try:
            dcp.load(states, checkpoint_id=path, process_group=self.pg)
        except (
            Exception,
            CheckpointException,
        ) as e:  # DCP raises it on every rank when any read fails
            if is_comm_failure(e):  # a peer died mid-load: not the checkpoint's fault
                raise
            if isinstance(e, CheckpointException):  # its message lists every rank's traceback
                failures = list(e.failures.values())
                e = failures[0][0] if failures else e
            if isinstance(e, StateVersionError):  # readable, but not by this build's data loader
                raise CheckpointError(f"checkpoint '{path}': {e}") from e
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            what = f"({type(e).__name__}: {first[:200]})"
            if not own:
                raise CheckpointError(
                    f"--checkpoint.initial_load_path: '{path}' could not be loaded {what}; it is damaged or"
                    " was saved by another model configuration (--model.name/flavor)"
                ) from e
            others = [
                str(c.step)
                for c in scan(self.folder)
                if c.complete and not c.model_only and c.path != path
            ]
            hint = (
                f"pick another step with --checkpoint.load_step (complete: {', '.join(others)})"
                if others
                else "move it away to start fresh"
            )
            raise CheckpointError(
                f"checkpoint '{path}' could not be loaded, it is corrupt or does not match"
                f" this model {what}; {hint}"
            ) from e

    # ------------------------------------------------------------------ save

    def _saves(self) -> bool:
        """Whether this run writes checkpoints at all (load_only: it only reads them)."""
        return self.cfg.enable and not self.cfg.load_only

    def _checkpoint_due(self, step: int, last: bool) -> bool:
        c = self.cfg
        first = step == 1 and c.enable_first_step_checkpoint
        return self._saves() and (last or first or step % c.interval == 0)

    def due(self, step: int, last: bool) -> bool:
        """Whether `maybe_save(step, last)` writes anything (a checkpoint or an HF export)."""
        return self._checkpoint_due(step, last) or (last and self.cfg.last_save_in_hf)

    def maybe_save(self, step: int, last: bool) -> None:
        """Between steps: publish a finished asynchronous save; save at the interval, after the
        first step (enable_first_step_checkpoint) and at the last step (synchronously, so a
        finished run's checkpoint is complete)."""
        self.poll()
        if self._checkpoint_due(step, last):
            # an export's marker names its Hugging Face twin (the path upstream's users look for)
            twin = (
                {"hf_export": hf_export_path(self.dump_folder, step)}
                if last and self.cfg.last_save_in_hf
                else {}
            )
            if last and self.cfg.last_save_model_only:
                dtype = DTYPES[self.cfg.export_dtype]
                self._save(
                    step,
                    {"model": ModelState(self.model_parts, dtype)},
                    model_only=True,
                    dtype=self.cfg.export_dtype,
                    extra=twin,
                )
            else:
                self._save(step, self.states, model_only=False, background=not last, extra=twin)
        if last and self.cfg.last_save_in_hf:  # after the checkpoint: a failed export loses nothing
            self._export_hf(step)

    def save_now(self, step: int) -> tuple[str, float] | None:
        """A preemption's save of `step`, synchronous (a save of it in flight is waited for);
        (its folder, the seconds it took), or None when checkpointing is off."""
        if not self._saves():
            return None
        start = time.monotonic()
        if self.saved_step != step:
            self._save(step, self.states, model_only=False)
        self.wait()
        return step_path(self.folder, step), time.monotonic() - start

    def save_estimate(self) -> float:
        """Seconds a synchronous save of the full state takes, as far as this run has seen
        (its saves, or its background writes): what a preemption save needs."""
        return max(self.save_s, self.async_saves.write_s if self.async_saves is not None else 0.0)

    def poll(self) -> None:
        if self.async_saves is not None:
            self._logged(self.async_saves.poll())

    def wait(self) -> None:
        """Until the save in flight, if any, is written and published (every rank)."""
        if self.async_saves is not None:
            self._logged(self.async_saves.wait())

    def _logged(self, line: str | None) -> None:
        if line is not None:
            self._prune()
            self.log(f"[torchtitan] {line}")

    def _export_hf(self, step: int) -> None:
        folder = hf_export_path(self.dump_folder, step)
        if self._agree(lambda: os.path.exists(folder)):  # e.g. a resumed run that exported before
            if _is_main():
                logger.info(
                    f"[torchtitan] Hugging Face export skipped: '{folder}' already exists (nothing is overwritten)"
                )
            return
        export_hf(self.model_parts, folder, self.hf, self.cfg.export_dtype, group=self.pg)
        if _is_main():
            logger.info(f"[torchtitan] Hugging Face folder written to {folder}")

    def save_seed(self) -> str:
        self._save(0, {"model": ModelState(self.model_parts)}, model_only=True, dtype="float32")
        return step_path(self.folder, 0)

    def _save(
        self,
        step: int,
        states: dict,
        model_only: bool,
        dtype: str = "",
        background: bool = False,
        *,
        extra: dict | None = None,
    ) -> None:
        """DCP files into step-N.tmp, then the marker, then the rename: the step becomes
        visible only complete, and an existing step-N is replaced only after that. With
        an async async_mode and `background`, the files are written while training goes on
        (async_saves.py) and the marker and rename follow once they are all written."""
        self.wait()  # one save in flight
        final = step_path(self.folder, step)
        tmp = final + ".tmp"
        start = time.monotonic()
        if _is_main():
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp, exist_ok=True)
        self._barrier()
        self._check_shared(tmp)
        record = marker_record(step, model_only, dtype, self.run_info, **(extra or {}))
        self.saved_step = step
        if background and self.async_saves is not None:
            staged = self.async_saves.start(
                step, states, _Writer(tmp, step), lambda: self._publish(tmp, final, record)
            )
            self.log(
                f"[torchtitan] checkpoint step-{step}: staged in {staged:.2f}s, writing in the background"
            )
            return
        dcp.save(states, storage_writer=_Writer(tmp, step), process_group=self.pg)
        self._barrier()
        self._publish(tmp, final, record)
        self._barrier()
        self._prune()
        took = time.monotonic() - start
        self.save_s = max(self.save_s, took)
        self.log(f"[torchtitan] checkpoint step-{step} saved in {took:.2f}s (training stopped)")

    def _publish(self, tmp: str, final: str, record: dict) -> None:
        """Rank 0, once every rank's files and DCP's metadata are in `tmp`: the marker, then
        the rename."""
        if not _is_main():
            return
        write_marker(tmp, record)
        old = final + ".old"
        shutil.rmtree(old, ignore_errors=True)
        if os.path.exists(final):
            os.replace(final, old)
        os.replace(tmp, final)  # a crash before this line: step-N.old still loads (scan)
        shutil.rmtree(old, ignore_errors=True)

    def _check_shared(self, tmp: str) -> None:
        """Every rank must see the folder rank 0 just created: DCP writes each rank's shard
        there and rank 0 alone marks and renames it."""
        seen = torch.tensor([1 if os.path.isdir(tmp) else 0])
        dist.all_reduce(seen, op=dist.ReduceOp.MIN, group=self.pg)
        if int(seen) == 0:
            raise CheckpointError(
                f"checkpoint folder '{tmp}' created by rank 0 is not visible on every rank: put"
                " --job.dump_folder on a file system shared by all nodes"
            )

    def _prune(self) -> None:
        """Delete temporaries a crash left behind, and with keep_latest_k the least recently
        saved full checkpoints beyond k (seed and weights-only checkpoints stay). Folders are
        renamed out of the way at once and removed in the background, so a slow file system
        never holds up training."""
        if not _is_main():
            return
        found = scan(self.folder)
        full = newest_first([c for c in found if c.complete and not c.model_only])
        newest = full[0].step if full else -1
        stale = [c for c in found if c.path.endswith(".tmp") and c.step < newest]
        old = full[self.cfg.keep_latest_k :] if self.cfg.keep_latest_k > 0 else []
        for c in stale + old:
            os.replace(
                c.path,
                os.path.join(self.folder, f".trash-{os.path.basename(c.path)}-{time.time_ns()}"),
            )
        trash = [
            os.path.join(self.folder, n) for n in os.listdir(self.folder) if n.startswith(".trash-")
        ]
        if trash and (self._deleting is None or not self._deleting.is_alive()):
            self._deleting = threading.Thread(
                target=lambda: [shutil.rmtree(t, ignore_errors=True) for t in trash], daemon=True
            )
            self._deleting.start()

    def settle(self) -> None:
        """Training stopped with an error every rank raised (no rank lost): let an asynchronous
        save of an earlier, good step finish and be published rather than cut it off when the
        process group goes down; a failure of it changes nothing (it stays step-N.tmp)."""
        try:
            self.wait()
        # broad on purpose: training already failed with the error the run reports; this is
        # best-effort cleanup, and a save that fails here stays step-N.tmp (never published)
        except (Exception, CheckpointException):
            pass

    def close(self) -> None:
        """End of training: wait for the save in flight and background deletions."""
        self.wait()
        if self.async_saves is not None:
            self.async_saves.close()
        if self._deleting is not None:
            self._deleting.join()


def _holds(path: str, key: str) -> bool:
    """Whether the DCP checkpoint at `path` has entries under `key`."""
    meta = dcp.FileSystemReader(path).read_metadata()
    return any(k == key or k.startswith(f"{key}.") for k in meta.state_dict_metadata)
