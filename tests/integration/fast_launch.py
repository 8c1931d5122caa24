"""A launcher for test runs that pays for `import torch` once per session instead of once per rank.

run_train.sh -> torchrun -> N fresh interpreters costs 6-10 s per run before the first step
(imports and process start-up) on the 2-core CI machines. Here a fork server (Python's
multiprocessing "forkserver") imports torch and torchtitan once (zygote_imports.py); each
run forks its N ranks from it. Every rank gets what torchrun would give it:

- the environment run_train.sh and torchrun set (RANK, LOCAL_RANK, WORLD_SIZE,
  LOCAL_WORLD_SIZE, MASTER_ADDR/PORT, TORCHELASTIC_*, PYTHONPATH, PYTHONUNBUFFERED,
  OMP_NUM_THREADS = cores // ranks unless set, applied with torch.set_num_threads too),
  with the rendezvous store hosted by the launcher as torchrun's agent hosts it (no port race);
- the same argv (`--job.config_file <CONFIG_FILE or llama3_debug.toml> <overrides>`);
- unbuffered stdout / stderr written to <log_dir>/<rank>/stdout.log and stderr.log, the
  console being the LOG_RANK ranks' lines (default rank 0) as torchrun --tee and
  --local-ranks-filter show them;
- its own session, so that a failed or timed-out run's ranks are stopped with their children.

A rank leaves with os._exit() after main() returns (threads joined and atexit handlers run as
at a normal exit, but the interpreter is not torn down: the gloo exit-time abort of
CPU_NOTES.md cannot happen here; that a finished run also exits 0 through a real interpreter
exit is left to the runs that keep run_train.sh). When a rank fails the others get SIGKILL, as
torchrun started by run_train.sh's launcher does it (torchtitan/launcher.py). Exit code: 124 after the timeout; the code in the
status file when a rank wrote one (a preemption's 75, a hang report's 1: run_train.sh's rule,
its line shown when the writing rank's output is not); 0 when every rank exited 0; 2 when the first rank to fail exited 2 (main's code for a bad config,
which run_train.sh's config check reports with 2 before launching, or a bad device); else 1
(torchrun's code). The config check run_train.sh does before launching is repeated by every
rank at start-up (load_config_or_exit), so a success path checks exactly what it did. A dry
run (dry_run=True) is one process of torchtitan.dry_run, as run_train.sh runs it. A fork
server that dies is reported (its log: SERVER_LOG) and replaced at the next launch.

Not covered (use run_train.sh): several nodes, --help, and runs whose environment
changes a variable read while importing (IMPORT_TIME_PREFIXES): the fork server imported
with the session's environment. `needs_torchrun(env)` tells.
"""

import atexit
import importlib
import io
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import sys
import tempfile
import threading
import time
import traceback
import types
from multiprocessing.connection import wait

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from torchtitan.resilience import exit_status  # noqa: E402  (torch-free)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DEFAULT_CONFIG = os.path.join(ROOT, "train_configs", "llama3_debug.toml")
# Variables torch, datasets, tokenizers & co. may read while being imported (TORCHRUN_LOG_DIR is
# run_train.sh's, read by no import).
IMPORT_TIME_PREFIXES = (
    "HF_",
    "TORCH_",
    "TORCHINDUCTOR_",
    "TORCHDYNAMO_",
    "PYTORCH_",
    "TRANSFORMERS_",
    "TOKENIZERS_",
    "DATASETS_",
    "KMP_",
    "MKL_",
    "LD_",
)

SERVER_LOG = os.path.join(tempfile.gettempdir(), f"titan_fork_server_{os.getpid()}.log")
_zygote_env: dict | None = None  # the environment the fork server imported with
_server_pid: int | None = None
PRELOADED = None  # in a rank: whether it was forked with zygote_imports already imported


def _context():
    """The forkserver context, its server running (started, or restarted if it died)."""
    global _zygote_env, _server_pid
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["zygote_imports"])
    # The fork server is `python -c ...` with the default sys.path (3.11 ignores the one it is
    # given) and skips a preload it cannot import: PYTHONPATH makes zygote_imports importable.
    # Its own output (say, why it stopped) goes to SERVER_LOG (zygote_imports.py).
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "TITAN_FORK_SERVER_LOG")}
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [HERE, ROOT, *([saved["PYTHONPATH"]] if saved["PYTHONPATH"] else [])]
    )
    os.environ["TITAN_FORK_SERVER_LOG"] = SERVER_LOG
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        for k, v in saved.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v
    pid = multiprocessing.forkserver._forkserver._forkserver_pid
    if pid != _server_pid:
        _zygote_env, _server_pid = dict(os.environ), pid
    return ctx


def _last_lines(path: str, n: int = 20) -> list[str]:
    try:
        with open(path, errors="replace") as f:
            return f.readlines()[-n:]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    """Running (a process that exited stays a zombie until its parent waits for it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def start() -> None:
    """Start the fork server (its imports run in the background); launch() does it otherwise."""
    _context()


def needs_torchrun(env: dict) -> list[str]:
    """The variables of `env` read at import time that differ from the fork server's."""
    base = _zygote_env if _zygote_env is not None else os.environ
    keys = set(env) | set(base)
    return sorted(
        k for k in keys if k.startswith(IMPORT_TIME_PREFIXES) and env.get(k) != base.get(k)
    )


def config_file(env: dict) -> str:
    """run_train.sh's CONFIG_FILE rule: default llama3_debug.toml; relative paths from the
    working directory, else from the repository root."""
    path = env.get("CONFIG_FILE") or DEFAULT_CONFIG
    if not os.path.isfile(path) and os.path.isfile(os.path.join(ROOT, path)):
        path = os.path.join(ROOT, path)
    return path


def threads_per_rank(env: dict, ngpu: int) -> int:
    """run_train.sh: OMP_NUM_THREADS if set, else the cores shared between the ranks."""
    if env.get("OMP_NUM_THREADS", "").isdigit() and int(env["OMP_NUM_THREADS"]) > 0:
        return int(env["OMP_NUM_THREADS"])
    return max(1, len(os.sched_getaffinity(0)) // ngpu)


def _exit_code(code) -> int:
    """What the interpreter makes of sys.exit(code)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _worker(entry: str, argv: list[str], env: dict, cwd: str, rank_dir: str, threads: int) -> None:
    """One rank, in a process forked from the fork server."""
    global PRELOADED
    PRELOADED = "zygote_imports" in sys.modules  # the fork server imported it (test_fast_launch.py)
    os.setsid()
    try:  # die with the fork server (it exits with the session that started it)
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass
    os.makedirs(rank_dir, exist_ok=True)
    inherited = (sys.stdout, sys.stderr)  # logging handlers made at import time may hold these
    for stream in inherited:
        stream.flush()
    for fd, name in ((1, "stdout.log"), (2, "stderr.log")):
        f = os.open(os.path.join(rank_dir, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    for stream in inherited:  # they write to the files now too: line by line
        stream.reconfigure(line_buffering=True)
    # As python -u (PYTHONUNBUFFERED, which run_train.sh sets): every write reaches the file.
    sys.stdout = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False), encoding="utf-8", write_through=True
    )
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False),
        encoding="utf-8",
        errors="backslashreplace",
        write_through=True,
    )
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.argv = [entry, *argv]
    rc = 1
    try:
        import torch
        import zygote_imports  # noqa: F401  (else now: this checkout's torchtitan, never another one)

        torch.set_num_threads(threads)
        rc = _exit_code(importlib.import_module(entry).main())
    except SystemExit as e:
        rc = _exit_code(e.code)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            # As at interpreter exit: threading's exit hooks (they stop e.g. ThreadPoolExecutor
            # workers), non-daemon threads joined, then the atexit handlers.
            threading._shutdown()
            atexit._run_exitfuncs()
        finally:
            for stream in (*inherited, sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:
                    pass
            os._exit(rc)


class _Tail:
    """New complete lines of a rank's log files, as torchrun --tee shows them."""

    def __init__(self, paths: list[str]):
        self.pos = {p: 0 for p in paths}
        self.partial = {p: b"" for p in paths}

    def read(self, final: bool = False) -> str:
        out = []
        for path in self.pos:
            try:
                with open(path, "rb") as f:
                    f.seek(self.pos[path])
                    data = f.read()
            except FileNotFoundError:
                continue
            self.pos[path] += len(data)
            data = self.partial[path] + data
            if final:
                done, self.partial[path] = data, b""
            else:
                cut = data.rfind(b"\n") + 1
                done, self.partial[path] = data[:cut], data[cut:]
            if done:
                out.append(done.decode(errors="replace"))
        text = "".join(out)
        return text if not text or text.endswith("\n") else text + "\n"


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        try:  # forked but not yet its own session
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def launch(
    ngpu: int,
    argv: list[str],
    log_dir: str,
    env: dict,
    timeout: float,
    entry: str = "torchtitan.train",
    with_config: bool = True,
    dry_run: bool = False,
) -> tuple[int, str]:
    """Run `entry`'s main() on `ngpu` forked ranks; (exit code, console output).

    argv: the overrides run_train.sh is given; with_config puts `--job.config_file <config>`
    first, as run_train.sh does (entry torchtitan.train), else argv is passed as it is.
    env: the environment run_train.sh would be started with (NGPU, LOG_RANK, ...).
    dry_run: as run_train.sh runs a --job.dry_run=true job: torchtitan.dry_run in one process,
    WORLD_SIZE=ngpu, no torchrun variables, threads left alone.
    """
    from torch.distributed import TCPStore

    ctx = _context()
    server = _server_pid
    if dry_run:
        env = {**env, "WORLD_SIZE": str(ngpu)}
        entry, ngpu = "torchtitan.dry_run", 1
    threads = threads_per_rank(env, ngpu)
    base = {
        **env,
        "PYTHONPATH": ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""),
        "PYTHONUNBUFFERED": "1",
    }
    if not dry_run:
        base["OMP_NUM_THREADS"] = str(threads)
    if with_config:
        argv = ["--job.config_file", config_file(env), *argv]
    if (
        not dry_run
        and entry == "torchtitan.train"
        and not any("memory_budget_gib" in a for a in argv)
    ):
        # The start-up memory prediction (a child process per run) is tested by the runs that
        # set a budget; the others skip it to keep the suite fast.
        argv = [*argv, "--planning.memory_budget_gib=none"]
    log_ranks = sorted({int(r) for r in env.get("LOG_RANK", "0").split(",") if r.strip()})
    for rank in range(ngpu):  # this launch's logs only (a resumed run reuses its dump folder)
        for name in ("stdout.log", "stderr.log"):
            if os.path.exists(os.path.join(log_dir, str(rank), name)):
                os.remove(os.path.join(log_dir, str(rank), name))
    tail = _Tail(
        [
            os.path.join(log_dir, str(r), name)
            for r in log_ranks
            if r < ngpu
            for name in ("stdout.log", "stderr.log")
        ]
    )
    # torchrun's agent hosts the rendezvous store and the ranks connect to it
    # (TORCHELASTIC_USE_AGENT_STORE): a port taken by the store itself, nothing to race for.
    store = None if dry_run else TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    # run_train.sh's status file: a rank that ends the run on purpose (preemption, hang report)
    # writes its exit code and line there (torchtitan/resilience/exit_status.py)
    fd, status_path = tempfile.mkstemp(prefix="titan_status_")
    os.close(fd)
    run_id = f"fast{os.getpid()}_{time.monotonic_ns()}"
    procs = []
    console: list[str] = []
    start = time.monotonic()
    timed_out, first_failure = False, None
    # multiprocessing re-runs the parent's __main__ script in each child (spawn semantics: run_tests.py
    # as a CLI, a pytest console script): the ranks run `entry`, so show it a __main__ without a file.
    main_module = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        for rank in range(ngpu):
            renv = (
                base
                if dry_run
                else {
                    **base,
                    "RANK": str(rank),
                    "LOCAL_RANK": str(rank),
                    "GROUP_RANK": "0",
                    "ROLE_RANK": str(rank),
                    "ROLE_NAME": "default",
                    "WORLD_SIZE": str(ngpu),
                    "LOCAL_WORLD_SIZE": str(ngpu),
                    "GROUP_WORLD_SIZE": "1",
                    "ROLE_WORLD_SIZE": str(ngpu),
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(store.port),
                    "TORCHELASTIC_RESTART_COUNT": "0",
                    "TORCHELASTIC_MAX_RESTARTS": "0",
                    "TORCHELASTIC_RUN_ID": run_id,
                    "TORCHELASTIC_USE_AGENT_STORE": "True",
                    "TORCHTITAN_STATUS_FILE": status_path,
                    "TORCH_NCCL_ASYNC_ERROR_HANDLING": env.get(
                        "TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"
                    ),
                }
            )
            p = ctx.Process(
                target=_worker,
                args=(entry, argv, renv, os.getcwd(), os.path.join(log_dir, str(rank)), threads),
                name=f"rank{rank}",
            )
            try:
                p.start()
            except (EOFError, OSError) as e:
                if _alive(server):
                    raise
                raise RuntimeError(
                    f"the fork server (pid {server}) died while starting rank {rank} (killed from"
                    " outside?); the next run starts a new one"
                ) from e
            procs.append(p)
        sys.modules["__main__"] = main_module
        while any(p.exitcode is None for p in procs):
            wait([p.sentinel for p in procs if p.exitcode is None], timeout=0.1)
            console.append(tail.read())
            now = time.monotonic()
            if first_failure is None:
                failed = [
                    (r, p.exitcode) for r, p in enumerate(procs) if p.exitcode not in (None, 0)
                ]
                if (
                    failed
                ):  # as run_train.sh's launcher (torchtitan/launcher.py): SIGKILL to the rest
                    first_failure = failed[0]
                    for p in procs:
                        if p.exitcode is None:
                            _signal_group(p.pid, signal.SIGKILL)
            if not timed_out and now > start + timeout:
                timed_out = True
                for p in procs:
                    _signal_group(p.pid, signal.SIGKILL)
    finally:
        sys.modules["__main__"] = main_module
        for p in procs:  # interrupted (^C, an error here): leave nothing running
            if p.exitcode is None:
                _signal_group(p.pid, signal.SIGKILL)
                p.join()
        del store
    console.append(tail.read(final=True))
    codes, pids = [p.exitcode for p in procs], [p.pid for p in procs]
    for p in procs:
        p.close()
    if first_failure is None:
        first_failure = next(((r, c) for r, c in enumerate(codes) if c != 0), None)
    status = exit_status.read(status_path)
    os.remove(status_path)
    if timed_out:
        rc = 124
    elif (
        status is not None
    ):  # as run_train.sh: the rank's code, its line when the console does not show it
        rc = status[0]
        if status[1] not in log_ranks:
            console.append(("[torchtitan] " if rc in (0, 75) else "error: ") + status[2] + "\n")
    elif all(c == 0 for c in codes):
        rc = 0
    elif first_failure[1] == 2:
        rc = 2
    else:
        rc = 1
    if rc != 0 and not _alive(server):
        # multiprocessing reports 255 for ranks whose fork server vanished. Their parent-death
        # signal kills them, a moment after the server's sockets closed: make sure of it.
        for p in filter(_alive, pids):
            _signal_group(p, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(map(_alive, pids)) and time.monotonic() < deadline:
            time.sleep(0.05)
        console.append(
            f"[fast_launch] the fork server (pid {server}) died during this run, its ranks with it"
            f" (killed from outside?); the next run starts a new one. The end of its log {SERVER_LOG}:\n"
            + "".join(_last_lines(SERVER_LOG))
        )
    if rc not in (0, 124) and first_failure is not None:
        # torchrun's failure summary, in the lines checkpoint_checks.rank_exit_codes reads
        console.append(
            f"[fast_launch] {entry} failed: rank {first_failure[0]} exited first "
            f"(exit code {first_failure[1]}); ranks still running then got SIGKILL\n"
        )
        for r, c in enumerate(codes):
            if c != 0:
                console.append(f"  rank      : {r} (local_rank: {r})\n  exitcode  : {c}\n")
    return rc, "".join(console)
