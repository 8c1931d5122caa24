"""`python -m torchtitan.launcher <torchrun arguments>`: torchrun, with SIGTERM and SIGUSR1 left
to the ranks. run_train.sh starts every run through it.

A preemption signal asks the ranks to finish their step, checkpoint it and exit
(resilience/preemption.py). torchrun (2.13) would get in the way: on SIGTERM it stops the
workers after --shutdown-timeout (30 s, too short for a large save) and exits 1 with a
SignalException traceback whatever they returned; SIGUSR1, not among its --signals-to-handle by
default, kills it and orphans the workers. This process is torchrun, except that:

- it keeps running on SIGTERM and SIGUSR1 and passes each on to its workers, also to those not
  started yet when it came (rendezvous may take minutes), as torchrun passes on the signals it
  handles itself (run_train.sh gives it --signals-to-handle=SIGINT,SIGHUP,SIGQUIT);
- when a worker fails, torchrun stops the others with SIGTERM, which the ranks would take for a
  preemption (and a rank blocked in a collective with the dead one could not even run its
  handler): here they get SIGKILL, as promptly as SIGTERM's default action stopped them before;
- it runs in a process group of its own, so a terminal's ^C reaches it once, from run_train.sh
  (which passes on INT, HUP and QUIT too), and it takes SIGINT and SIGQUIT back from the
  "ignored" a shell gives a background command.

Handlers, not SIG_IGN: a handler is reset at exec, so the workers start with the default action
(a worker signalled before its training loop starts ends at once: there is nothing to save).
Under Slurm every process of the job is signalled anyway; a worker signalled twice counts it once.
"""

import os
import signal
import sys
import threading
import time

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
_pending: set[int] = set()  # preemption signals received so far
_told: set[tuple[int, int]] = set()  # (pid, signal) already passed on
_lock = threading.Lock()


def workers(parent: int) -> list[int]:
    """Pids of `parent`'s children (torchrun starts each worker as its direct child)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # the command name may hold spaces
        except OSError:
            continue
        if int(fields[1]) == parent:
            found.append(int(name))
    return found


def _pass_on() -> None:
    """Each pending signal to each worker that has not had it."""
    with _lock:
        for pid in workers(os.getpid()):
            for sig in sorted(_pending):
                if (pid, sig) not in _told:
                    _told.add((pid, sig))
                    try:
                        os.kill(pid, sig)
                    except ProcessLookupError:
                        pass


def _watch() -> None:
    """After a signal: workers started later get it too."""
    while True:
        time.sleep(0.2)
        _pass_on()


def _on_signal(signum, frame) -> None:
    first = not _pending
    _pending.add(signum)
    _pass_on()
    if first:
        threading.Thread(target=_watch, name="pass-on-signals", daemon=True).start()


def _kill_on_failure() -> None:
    """torchrun stops the rest of a failed group with SIGTERM: make it SIGKILL (docstring).
    Stops caused by a signal torchrun handles (INT, HUP, QUIT) keep that signal.

    torch 2.13 sends that SIGTERM from two places: the agent's `_shutdown`, and first the
    process context's own poll, which on the first failed worker calls `close()` with no
    signal (its default, SIGTERM) before the agent hears of it. Both are changed here; a rank
    still alive then exits -9, never -15 (seen with only `_shutdown` changed: a survivor
    exited -15 in 2 of 4 runs of tests/integration/test_checkpoint.py's killed-rank test)."""
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.multiprocessing.api import PContext

    shutdown, close = LocalElasticAgent._shutdown, PContext.close

    def _shutdown(self, death_sig=signal.SIGTERM, timeout=30):
        return shutdown(self, signal.SIGKILL if death_sig == signal.SIGTERM else death_sig, timeout)

    def _close(self, death_sig=None, timeout=30):
        return close(self, death_sig or signal.SIGKILL, timeout)

    LocalElasticAgent._shutdown = _shutdown
    PContext.close = _close


def main() -> None:
    try:
        os.setpgid(0, 0)
    except OSError:  # already a group leader (started by hand): keep it
        pass
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)
    for sig in SIGNALS:
        signal.signal(sig, _on_signal)
    _kill_on_failure()
    from torch.distributed.run import main as torchrun

    sys.argv[0] = "torchrun"
    torchrun()


if __name__ == "__main__":
    main()
