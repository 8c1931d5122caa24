"""`python -m torchtitan.launcher <torchrun arguments>`: torchrun, with SIGTERM and SIGUSR1 left
to the ranks. run_train.sh starts every run through it.

A preemption signal asks the ranks to finish their step, checkpoint it and exit
(components/preemption.py). torchrun (2.13) would get in the way: on SIGTERM it stops the
workers after --shutdown-timeout (30 s, too short for a large save) and exits 1 with a
SignalException traceback whatever they returned; SIGUSR1, not among its --signals-to-handle by
default, kills it and orphans the workers. This process is torchrun, except that it keeps running
on those two signals and passes each on to its workers, as torchrun passes on the signals it
handles itself (run_train.sh gives it --signals-to-handle=SIGINT,SIGHUP,SIGQUIT). Under Slurm
every process of the job is signalled anyway; a worker signalled twice counts it once.

Handlers, not SIG_IGN: a handler is reset at exec, so the workers start with the default action
(a worker signalled before its training loop starts ends at once: there is nothing to save).
"""

import os
import signal
import sys

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


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


def _forward(signum, frame) -> None:
    for pid in workers(os.getpid()):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def main() -> None:
    for sig in SIGNALS:
        signal.signal(sig, _forward)
    from torch.distributed.run import main as torchrun

    sys.argv[0] = "torchrun"
    torchrun()


if __name__ == "__main__":
    main()
