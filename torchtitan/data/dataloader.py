"""The training dataloader: a rank's slots, read by torch DataLoader workers in micro-step order.

A rank owns rows_per_rank = local_batch_size x accum_steps consecutive slots of the global
batch, used as accum_steps micro-steps of local_batch_size rows. Each micro-step is cut into p
contiguous groups of rows ("parts"); DataLoader hands out part b from worker b % W, so with
W dividing p x accum_steps every worker always makes the same parts: the slots are split across
workers, each slot read by exactly one process. Parts carry their slots' positions after them
(data/datasets.py), so `state_dict()` is exact for what the trainer was given, however far the
workers read ahead, and it is per global slot: it loads into any layout and any worker count.
"""

from __future__ import annotations

import atexit
import gc
import math
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import DataLoader

from torchtitan.data.datasets import STATE_VERSION, DataError, SlotParts, fresh_state
from torchtitan.data.documents import describe
from torchtitan.data.kinds import open_documents
from torchtitan.data.mixture import MixError, parse_mix, pattern, windows_by_source
from torchtitan.data.slots import read_case


def _worker_init(worker_id: int) -> None:
    """Loader workers leave SIGTERM / SIGUSR1 / SIGINT / SIGHUP to their rank: Slurm signals every
    process of a job, and a worker killed by it would fail the rank's preemption save. A worker
    ends when its rank does (torch's loader watches the parent). The collector, which the rank
    may have switched off (training.gc_freq), runs on its own schedule again: a worker takes
    part in no step."""
    import signal

    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    gc.enable()


@dataclass(frozen=True)
class LoaderOptions:
    """A [training.dataloader] / [validation.dataloader] section's options besides num_workers
    (loader_options)."""

    persistent_workers: bool = False
    prefetch_factor: int | None = None  # batches each worker reads ahead; None: torch's (2)
    pin_memory: bool = False  # page-locked batches, for a faster copy to a GPU


def resolve_workers(setting, device_type: str) -> int:
    """num_workers: auto = 2 on CUDA (the GPU's thread never tokenises), 0 on CPU."""
    if setting == "auto":
        return 2 if device_type == "cuda" else 0
    return int(setting)


def loader_options(section, device_type: str) -> LoaderOptions:
    """A DataLoader config section's options; pin_memory only on CUDA (there is no faster copy
    to make on CPU)."""
    prefetch = section.prefetch_factor
    return LoaderOptions(
        persistent_workers=section.persistent_workers,
        prefetch_factor=None if prefetch == "auto" else int(prefetch),
        pin_memory=section.pin_memory and device_type == "cuda",
    )


_RUNNING: weakref.WeakSet = weakref.WeakSet()  # DataLoader iterators with workers, ended at exit
_EXIT_HOOK: list = []  # registered once


def _end_workers_at_exit() -> None:
    """Workers ignore SIGTERM, which is how multiprocessing ends daemonic children at exit
    (its exit hook would then wait for ever): shut them down first, as torch's loader does
    when it is deleted (each worker sees the request between two parts), then kill any left.
    Registered when the first workers start, so it runs before torch's and multiprocessing's
    hooks (atexit runs last-in first)."""
    import signal

    for it in list(_RUNNING):
        try:
            it._shutdown_workers()
        except Exception:  # noqa: BLE001 -- kept broad: at exit, a worker already gone can fail
            pass  # its shutdown in many ways, none worth a traceback; the SIGKILL below ends it
        for w in getattr(it, "_workers", []):
            if w.is_alive():
                os.kill(w.pid, signal.SIGKILL)


def _as_is(part: dict) -> dict:
    """Parts stay numpy in the worker (torch's default would make tensors, sent through shared memory)."""
    return part


class StateVersionError(ValueError):
    """A checkpoint's data position written by an older build; one line."""


def worker_layout(workers: int, local_batch: int, accum_steps: int) -> tuple[int, int]:
    """(workers used, parts per micro-step): the most workers up to `workers` that can own
    fixed parts, i.e. W divides p x accum_steps with p <= local_batch (p = W / gcd(W, accum))."""
    for w in range(workers, 0, -1):
        p = w // math.gcd(w, accum_steps)
        if p <= local_batch:
            return w, p
    return 0, 1


def part_slots(first_slot: int, local_batch: int, accum_steps: int, p: int) -> list[list[int]]:
    """The slots of each part, in the order the trainer consumes them."""
    out = []
    for m in range(accum_steps):
        base = first_slot + m * local_batch
        for g in range(p):
            out.append(list(range(base + g * local_batch // p, base + (g + 1) * local_batch // p)))
    return out


def mixture_sources(training) -> list[tuple[str, float, str]]:
    """(dataset, weight, name) of each source: the mixture's, or the one dataset."""
    mix = getattr(training, "dataset_mix", None) or []
    if not mix:
        return [(training.dataset, 1.0, "")]
    return [(s.dataset, s.weight, s.name) for s in parse_mix(mix)]


class SlotLoader:
    """Yields (input_ids, labels), [local_batch_size, seq_len] each, one per micro-step."""

    def __init__(
        self,
        training,
        tokenizer,
        dp_rank: int,
        dp_degree: int,
        accum_steps: int,
        *,
        section: str = "training",
        workers: int = 0,
        options: LoaderOptions | None = None,
        log: Callable[[str], None] | None = None,
    ):
        self.section, self.log = section, log or (lambda line: None)
        self.options = options or LoaderOptions()
        self.local_batch, self.accum_steps, self.seq_len = (
            training.local_batch_size,
            accum_steps,
            training.seq_len,
        )
        self.rows_per_rank = self.local_batch * accum_steps
        self.first_slot = dp_rank * self.rows_per_rank
        self.num_slots = self.rows_per_rank * dp_degree
        try:
            mix = mixture_sources(training)
        except MixError as e:
            raise DataError(f"--{section}.dataset_mix: {e}") from None
        self.names = [name for _, _, name in mix]
        self.sources = [
            open_documents(
                ds,
                training.dataset_split,
                training.dataset_config_name,
                training.dataset_text_field,
                tokenizer,
                section=section,
                # a named dataset's location; a mixture names each source's own
                dataset_path=training.dataset_path if len(mix) == 1 else "",
            )
            for ds, _, _ in mix
        ]
        self.labels = [describe(ds, training.dataset_split) for ds, _, _ in mix]
        self.pattern = pattern([w for _, w, _ in mix], self.num_slots) if len(mix) > 1 else None
        self.workers, self.parts_per_step = worker_layout(workers, self.local_batch, accum_steps)
        self.part_slots = part_slots(
            self.first_slot, self.local_batch, accum_steps, self.parts_per_step
        )
        self.slots = list(range(self.first_slot, self.first_slot + self.rows_per_rank))
        self.states = {s: fresh_state(len(self.sources)) for s in self.slots}
        self.bytes_read = 0
        self.epochs_logged: set[str] = set()
        self.consumed = 0  # micro-steps handed to the trainer

    def describe(self) -> list[str]:
        """The start line's facts: per source, how it is read and, when more than once, the fix."""
        lines = []
        ranks = self.num_slots // self.rows_per_rank
        for label, src in zip(self.labels, self.sources):
            what, fix = read_case(src.kind, src.num_shards, self.num_slots, self.rows_per_rank)
            if (
                getattr(src, "scanned", 0) and ranks > 1
            ):  # a raw file: every rank scans it for its line starts
                fix = (
                    f"each of the {ranks} ranks also scans the file once for its line starts ({ranks + 1} reads of"
                    " it an epoch); pre-tokenize it (scripts/tokenize_dataset.py) to read it once"
                )
            lines.append(f"{label}: {what}" + (f"; {fix}" if fix else ""))
        workers = (
            f"{self.workers} loader worker(s)"
            if self.workers
            else "read on the training thread (no workers)"
        )
        return lines + [f"{self.rows_per_rank} rows per rank of {self.num_slots}, {workers}"]

    def windows_by_source(self, steps: int) -> dict[str, int]:
        """Windows each source gave the whole job in its first `steps` steps (mixtures only)."""
        if self.pattern is None:
            return {}
        return dict(zip(self.names, windows_by_source(self.pattern, steps * self.num_slots)))

    def _loader(self) -> DataLoader:
        dataset = SlotParts(
            self.sources,
            self.labels,
            self.pattern,
            self.part_slots,
            self.num_slots,
            seq_len=self.seq_len,
            states=dict(self.states),
            section=self.section,
        )
        opts = self.options
        return DataLoader(
            dataset,
            batch_size=None,
            collate_fn=_as_is,
            num_workers=self.workers,
            persistent_workers=opts.persistent_workers and self.workers > 0,
            prefetch_factor=opts.prefetch_factor if self.workers else None,
            worker_init_fn=_worker_init if self.workers else None,
        )

    def __iter__(self):
        it = iter(self._loader())
        if self.workers:
            if not _EXIT_HOOK:
                _EXIT_HOOK.append(atexit.register(_end_workers_at_exit))
            _RUNNING.add(it)  # weakly: an iterator dropped earlier shuts its workers down itself
        while True:
            parts = [next(it) for _ in range(self.parts_per_step)]
            for part in parts:
                if "error" in part:
                    raise DataError(part["error"])
            self.states.update({s: st for part in parts for s, st in part["states"].items()})
            self.bytes_read += sum(part["bytes"] for part in parts)
            for event in (e for part in parts for e in part["events"]):
                if event not in self.epochs_logged:
                    self.epochs_logged.add(event)
                    self.log(f"[torchtitan] data: {event}")
            self.consumed += 1
            windows = (
                parts[0]["windows"]
                if len(parts) == 1
                else np.concatenate([p["windows"] for p in parts])
            )
            batch = torch.from_numpy(windows)
            if self.options.pin_memory:  # here: the workers hand out numpy, which torch never pins
                batch = batch.pin_memory()
            yield batch[:, :-1], batch[:, 1:]

    def state_dict(self) -> dict:
        if self.consumed % self.accum_steps:
            raise RuntimeError("the data position is saved between steps")
        return {int(s): dict(st) for s, st in self.states.items()}

    def load_state_dict(self, states: dict) -> None:
        for s in self.slots:
            st = states.get(s, states.get(str(s)))
            if st is None:
                raise StateVersionError(
                    f"the checkpoint holds no data position for global batch row {s}"
                )
            if not isinstance(st, dict) or st.get("v") != STATE_VERSION:
                raise StateVersionError(
                    "the checkpoint's data position was written before documents were read once per job (format"
                    f" {st.get('v', 1) if isinstance(st, dict) else 1}, this build reads {STATE_VERSION}); it cannot"
                    " resume the data exactly: start a new run from its weights with --checkpoint.initial_load_path=<that"
                    " step folder>"
                )
            if len(st["positions"]) != len(self.sources):
                raise StateVersionError(
                    f"the checkpoint's data position has {len(st['positions'])} source(s), this run reads"
                    f" {len(self.sources)}: resume with the same --{self.section}.dataset/dataset_mix"
                )
            self.states[s] = st
        self.consumed = 0


def build_dataloader(
    training,
    tokenizer,
    dp_rank: int,
    dp_degree: int,
    accum_steps: int,
    *,
    section: str = "training",
    workers: int = 0,
    options: LoaderOptions | None = None,
    log: Callable[[str], None] | None = None,
) -> SlotLoader:
    """Batches of (input_ids, labels), [local_batch_size, seq_len] each, one per micro-step.
    `workers`: loader processes (resolve_workers); `options`: the rest of the section's keys."""
    return SlotLoader(
        training,
        tokenizer,
        dp_rank,
        dp_degree,
        accum_steps,
        section=section,
        workers=workers,
        options=options,
        log=log,
    )
