"""Hang reports: a per-rank watchdog that says which rank stopped and where the others wait.

Without it, a rank stuck in a data read or frozen by its driver makes every other rank wait in
the next collective until [comm] timeout_seconds, and they all exit without saying who was
where. With it (`[comm] hang_timeout_seconds`), each rank:

- marks progress points from the training loop (`progress("step 7: data")`, ...);
- runs a thread that every `interval` seconds writes a heartbeat (beat number, progress points
  passed, the last one and how long ago) under its rank in the rendezvous store (torchrun's
  agent hosts it, so it outlives any rank);
- when its own last progress point is older than the hang timeout (and it is not paused:
  checkpoint saves, validation, compilation and the first step may legitimately take longer),
  writes its Python stacks (every thread) to <dump>/hang/rank<r>.txt (on CUDA also NCCL's flight
  recorder, nccl_trace_rank<r>.pkl), publishes where its main thread waits, and watches every
  rank's heartbeat for two more intervals: a rank whose heartbeat does not move is silent, it
  cannot speak for itself (frozen, dead). The lowest-numbered stuck rank that is alive writes
  the report (one line on its console and in the launcher's status file, hang/report.txt with
  a line per rank); then every stuck rank exits 1 and the launcher stops the rest.

A report is written within hang_timeout + 6 intervals of the stall, before the collective
timeout ends the ranks (resilience/timeouts.py: longest_hang_timeout, checked before launch).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import sys
import threading
import time
import traceback
from datetime import timedelta

import torch

from torchtitan.resilience import exit_status
from torchtitan.resilience.hang_report import RankState, summary, table
from torchtitan.resilience.timeouts import heartbeat_interval

logger = logging.getLogger(__name__)


def _short(filename: str) -> str:
    """An installed package's file from its package on ('torch/distributed/x.py'), ours from
    'torchtitan/' on (a checkout may itself be called torchtitan, its .venv inside it)."""
    for marker in ("/site-packages/", "/torchtitan/"):
        if marker in filename:
            return filename[
                filename.rindex(marker) + (len(marker) if marker == "/site-packages/" else 1) :
            ]
    return os.path.basename(filename)


def where_waiting(frames: list[traceback.FrameSummary]) -> str:
    """'<innermost frame> (from <innermost torchtitan frame>)' of a stack."""
    if not frames:
        return ""
    text = lambda f: f"{_short(f.filename)}:{f.lineno} {f.name}"  # noqa: E731
    inner = frames[-1]
    ours = next((f for f in reversed(frames) if _short(f.filename).startswith("torchtitan/")), None)
    return text(inner) + (f" (from {text(ours)})" if ours is not None and ours is not inner else "")


def _stacks_text() -> tuple[str, str]:
    """(every thread's stack, where the main thread waits)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    main_id = threading.main_thread().ident
    out, where = [], ""
    for ident, frame in sys._current_frames().items():
        frames = traceback.extract_stack(frame)
        if ident == main_id:
            where = where_waiting(frames)
        out.append(
            f"--- thread {names.get(ident, ident)}{' (main)' if ident == main_id else ''} ---\n"
            + "".join(traceback.format_list(frames))
        )
    return "\n".join(out), where


class HangWatchdog:
    """`progress(activity)` at each progress point, `paused(activity)` around what may take
    longer; `start()` (heartbeats) when training starts, `arm()` once the first step is done,
    `close()` at the end. With timeout_s 0 only the activity is kept (for error lines)."""

    def __init__(
        self,
        timeout_s: float,
        dump_folder: str,
        rank: int,
        world: int,
        device: torch.device,
        *,
        watch_compile: bool = False,
    ):
        self.timeout = float(timeout_s)
        self.interval = heartbeat_interval(self.timeout)
        self.folder = os.path.join(dump_folder, "hang")
        self.rank, self.world, self.device = rank, world, device
        self.seq, self.activity, self.last = 0, "start-up", time.monotonic()
        self.armed = False
        self.longest_step = 0.0
        self._pauses, self._paused_s, self._paused_since = (
            0,
            0.0,
            0.0,
        )  # (nested) pauses, their total seconds
        self._compile_hooks = None
        self._watch_compile = watch_compile
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._beats = 0
        self._thread: threading.Thread | None = None
        self.reporting = threading.Event()  # set once this rank found itself stuck
        self.done = (
            threading.Event()
        )  # set when its report is out (main waits for it on a comm failure)

    # ---------------------------------------------------------------- main thread

    def progress(self, activity: str) -> None:
        self.seq += 1
        self.activity, self.last = activity, time.monotonic()
        self._wake.set()  # the heartbeat tells it at once (from the watchdog thread)

    @contextlib.contextmanager
    def paused(self, activity: str):
        self.progress(activity)
        self._pause()
        try:
            yield
        finally:
            self._resume()

    def _pause(self, _args=None) -> None:
        if self._pauses == 0:
            self._paused_since = time.monotonic()
        self._pauses += 1

    def _resume(self, _args=None) -> None:
        self._pauses -= 1
        self.last = time.monotonic()
        if self._pauses == 0:
            self._paused_s += self.last - self._paused_since

    def start(self) -> None:
        if self.timeout <= 0 or self._thread is not None:
            return
        if self._watch_compile:  # torch.compile compiles on first use, inside a step
            from torch._dynamo.callback import callback_handler

            callback_handler.register_start_callback(self._pause)
            callback_handler.register_end_callback(self._resume)
            self._compile_hooks = callback_handler
        self._thread = threading.Thread(target=self._run, name="hang-watchdog", daemon=True)
        self._thread.start()

    def arm(self) -> None:
        self.armed, self.last = True, time.monotonic()

    def paused_seconds(self) -> float:
        """Seconds spent in finished pauses so far (compilation, validation, saves)."""
        return self._paused_s

    def step_time(self, seconds: float) -> None:
        """A job whose steps take longer than the hang timeout is not hung: the limit becomes
        1.5 x the longest step when longer. `seconds`: observe/step_clock.py's step time,
        pauses (compilation) left out."""
        self.longest_step = max(self.longest_step, seconds)

    @property
    def limit(self) -> float:
        return max(self.timeout, 1.5 * self.longest_step)

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None and not self.reporting.is_set():
            self._thread.join(timeout=2 * self.interval + 5)
        if self._compile_hooks is not None:
            self._compile_hooks.remove_start_callback(self._pause)
            self._compile_hooks.remove_end_callback(self._resume)
            self._compile_hooks = None

    def wait_for_report(self) -> None:
        """On a failed collective: let a report in progress finish (it exits the process)."""
        if self.reporting.is_set():
            self.done.wait(timeout=8 * self.interval + 10)

    # ---------------------------------------------------------------- watchdog thread

    def _store(self):
        from torch.distributed import PrefixStore, TCPStore

        store = TCPStore(
            os.environ.get("MASTER_ADDR", "127.0.0.1"),
            int(os.environ["MASTER_PORT"]),
            is_master=False,
            timeout=timedelta(seconds=max(30.0, 4 * self.interval)),
            wait_for_workers=False,
        )
        run = (
            os.environ.get("TORCHELASTIC_RUN_ID", "local")
            + "/"
            + os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        )
        return PrefixStore(f"torchtitan_hang/{run}/", store)

    def _run(self) -> None:
        store, failures = None, 0
        while not self._stop.is_set():
            try:
                store = store or self._store()
                self._beat(store)
                failures = 0
                if self.armed and self._pauses == 0 and time.monotonic() - self.last > self.limit:
                    self._report(store)  # exits the process, unless progress came back
            # the store is unreachable (a restart, the job ending): retry. c10d's store errors are
            # RuntimeErrors (DistStoreError) or OS-level; anything else is a bug of ours and kills
            # this thread with its traceback
            except (RuntimeError, OSError, TimeoutError) as e:
                store, failures = None, failures + 1
                if failures == 1 and not self._stop.is_set():
                    logger.warning(
                        f"[torchtitan] rank {self.rank}: hang watchdog cannot reach the rendezvous store"
                        f" ({type(e).__name__}: {e}); retrying"
                    )
            self._wake.wait(
                self.interval if failures == 0 else min(30.0, self.interval * 2**failures)
            )
            self._wake.clear()
            self._stop.wait(
                self.interval / 4
            )  # at most 4 heartbeats per interval, however fast the steps

    def _beat(self, store) -> None:
        self._beats += 1
        quiet = time.monotonic() - self.last
        store.set(
            f"hb/{self.rank}",
            json.dumps(
                {
                    "n": self._beats,
                    "seq": self.seq,
                    "activity": self.activity,
                    "quiet": round(quiet, 1),
                    "paused": self._pauses > 0,
                    "host": socket.gethostname(),
                    "pid": os.getpid(),
                    "t": time.time(),
                }
            ),
        )

    def _heartbeats(self, store) -> dict[int, dict]:
        keys = [f"hb/{r}" for r in range(self.world)]
        if store.check(keys):
            return {r: json.loads(v) for r, v in enumerate(store.multi_get(keys))}
        return {r: json.loads(store.get(k)) for r, k in enumerate(keys) if store.check([k])}

    def _report(self, store) -> bool:
        """Report and exit the process; returns (False) only when this rank made progress
        again meanwhile."""
        self.done.clear()
        self.reporting.set()
        try:
            return self._report_and_exit(store)
        finally:
            self.reporting.clear()
            self.done.set()

    def _report_and_exit(self, store) -> bool:
        quiet, seq = time.monotonic() - self.last, self.seq
        os.makedirs(self.folder, exist_ok=True)
        stacks, where = _stacks_text()
        with open(os.path.join(self.folder, f"rank{self.rank}.txt"), "w") as f:
            f.write(
                f"rank {self.rank} (host {socket.gethostname()}, pid {os.getpid()}): {quiet:.1f}s without"
                f" progress; last progress point: {self.activity}\n\n{stacks}"
            )
        if (
            self.device.type == "cuda"
        ):  # NCCL's flight recorder (on by default: TORCH_FR_BUFFER_SIZE=2000)
            with contextlib.suppress(Exception):
                trace = torch._C._distributed_c10d._dump_nccl_trace()
                with open(os.path.join(self.folder, f"nccl_trace_rank{self.rank}.pkl"), "wb") as f:
                    f.write(trace)
        store.set(f"stuck/{self.rank}", json.dumps({"where": where, "quiet": round(quiet, 1)}))
        first = self._heartbeats(store)
        self._beating(
            store, 2 * self.interval + 0.5
        )  # every live rank beats at least twice meanwhile
        if self.seq != seq:  # it was slow, not stuck: no report, watch on
            store.delete_key(f"stuck/{self.rank}")
            logger.info(
                f"[torchtitan] rank {self.rank}: {quiet:.0f}s without progress, then progress again: no hang"
            )
            return False
        last = self._heartbeats(store)
        alive = {
            r for r, hb in last.items() if r == self.rank or hb["n"] != first.get(r, {}).get("n")
        }
        reporter = self._elect(store, alive)
        if reporter:
            deadline = time.monotonic() + 3 * self.interval  # the other live ranks' records
            while time.monotonic() < deadline and not store.check([f"stuck/{r}" for r in alive]):
                self._beating(store, self.interval / 2)
            states = []
            for r in range(self.world):
                hb = last.get(
                    r, first.get(r, {"seq": -1, "activity": "never reached training", "quiet": 0.0})
                )
                stuck = json.loads(store.get(f"stuck/{r}")) if store.check([f"stuck/{r}"]) else {}
                states.append(
                    RankState(
                        r,
                        r in alive,
                        hb["seq"],
                        hb["activity"],
                        stuck.get("quiet", hb["quiet"]),
                        stuck.get("where", ""),
                        hb.get("host", ""),
                        silent_s=time.time() - hb["t"] if "t" in hb else 0.0,
                    )
                )
            line = summary(states, self.limit, self.folder)
            with open(os.path.join(self.folder, "report.txt"), "w") as f:
                f.write(
                    f"{line}\n\nreported by rank {self.rank}, hang_timeout_seconds={self.timeout:g}"
                    f" (limit {self.limit:.0f}s: 1.5 x the longest step if longer)\n\n{table(states)}\n"
                )
            sys.stdout.flush()
            os.write(2, f"error: {line}\n".encode())
            exit_status.record(exit_status.EXIT_FAILED, line)
            store.set("reported", str(self.rank))
        else:  # beating on, so that the reporter sees this rank alive
            deadline = time.monotonic() + 6 * self.interval + 5
            while time.monotonic() < deadline and not store.check(["reported"]):
                self._beating(store, self.interval / 2)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(exit_status.EXIT_FAILED)

    def _beating(self, store, seconds: float) -> None:
        """Sleep `seconds` while heartbeating every interval."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(left, self.interval))
            self._beat(store)

    def _elect(self, store, alive: set[int]) -> bool:
        """Whether this rank writes the report: the lowest live rank that found itself stuck,
        claimed once in the store (a later one, or one that watched differently, defers)."""
        stuck = [r for r in sorted(alive) if r == self.rank or store.check([f"stuck/{r}"])]
        if stuck[0] != self.rank:
            return False
        return store.compare_set("reporter", "", str(self.rank)).decode() == str(self.rank)
