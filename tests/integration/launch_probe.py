"""A stand-in for torchtitan.train under fast_launch.py (test_fast_launch.py): each rank
writes what it was given to <out>/rank<RANK>.json, then acts as its argv says.

    launch_probe.py OUT [print] [thread_pool] [ignore_sigterm RANK] [exit RANK CODE] [sleep SECONDS] ...

(RANK -1: every rank.)
"""

import json
import os
import signal
import sys
import time

POOLS = []


def main() -> int:
    out, actions = sys.argv[1], sys.argv[2:]
    rank = int(os.environ["RANK"])
    import torch

    seen = {
        "pid": os.getpid(),
        "argv": sys.argv[1:],
        "env": dict(os.environ),
        "threads": torch.get_num_threads(),
        "cwd": os.getcwd(),
        "preloaded": sys.modules["fast_launch"].PRELOADED,
        "torchtitan": sys.modules["torchtitan.train"].__file__
        if "torchtitan.train" in sys.modules
        else None,
    }
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(seen, f)
    code = 0
    while actions:
        what = actions.pop(0)
        if what == "print":  # one line on stdout, then one on stderr, then stdout again
            print(f"out {rank} a")
            print(f"err {rank}", file=sys.stderr)
            print(f"out {rank} b")
        elif what == "ignore_sigterm":
            if int(actions.pop(0)) in (rank, -1):
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
        elif what == "exit":
            who, value = int(actions.pop(0)), int(actions.pop(0))
            if who in (rank, -1):
                code = value
                break
        elif (
            what == "thread_pool"
        ):  # a pool worker waits for work until the interpreter's exit hooks
            from concurrent.futures import ThreadPoolExecutor

            POOLS.append(ThreadPoolExecutor(1))  # kept, as inductor keeps its pool
            POOLS[-1].submit(print, f"pool {rank}").result()
        elif what == "sleep":
            time.sleep(float(actions.pop(0)))
    return code
