"""How a run ended, told to the launcher: the exit codes, and the status file run_train.sh reads.

Exit codes of a run (run_train.sh's, and a worker's when it runs without run_train.sh):

    0   training finished
    1   training failed (a NaN loss, a dead or stalled rank, a hang report, a failed save)
    2   bad input (config, data, checkpoint, device): one line says which and how to fix it
    75  preempted (SIGTERM or SIGUSR1): the step in progress was finished and checkpointed;
        rerun the same command to resume (sysexits.h EX_TEMPFAIL, "try again later").
        scripts/multinode_trainer.slurm requeues the job on it; a cluster can make Slurm do so
        itself with RequeueExit=75 in slurm.conf.

torchrun's own exit code cannot carry these: it is 1 whenever a worker exits non-zero and 0 when
they all exit 0. So run_train.sh starts torchrun with TORCHTITAN_STATUS_FILE naming a fresh file
(one per node); a rank that ends the run on purpose writes its code and one line there and exits
0 (torchrun then neither prints a failure report nor restarts the workers), and run_train.sh
exits with the file's code once torchrun returns. It also prints the line when the rank that
wrote it is not among the ranks the console shows (LOG_RANK): a hang is reported by the lowest
rank still alive, which is not rank 0 when rank 0 is the frozen one.
"""

import os

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_PREEMPTED = 75

STATUS_FILE_ENV = "TORCHTITAN_STATUS_FILE"


def status_file() -> str | None:
    """The launcher's status file, or None when the run was not started by run_train.sh."""
    return os.environ.get(STATUS_FILE_ENV) or None


def record(code: int, line: str) -> None:
    """Tell the launcher (if run_train.sh started this run) that it ends with `code`, and why
    (`line`, one line). Written whole or not at all: run_train.sh may read it at any time."""
    path = status_file()
    if path is None:
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{code} {os.environ.get('LOCAL_RANK', '0')}\n{' '.join(line.split())}\n")
    os.replace(tmp, path)


def preempted_exit_code() -> int:
    """What a preempted worker exits with: 0 under run_train.sh (which exits EXIT_PREEMPTED
    from the status file), else EXIT_PREEMPTED itself."""
    return EXIT_OK if status_file() is not None else EXIT_PREEMPTED


def read(path: str) -> tuple[int, int, str] | None:
    """(exit code, local rank of the writer, line) of a status file, None if empty or absent."""
    try:
        with open(path) as f:
            head, _, line = f.read().partition("\n")
        code, local_rank = (int(x) for x in head.split())
    except (OSError, ValueError):
        return None
    return code, local_rank, line.strip()
