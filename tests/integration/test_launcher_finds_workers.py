"""The launcher finds its workers in /proc: a child it started is listed, the launcher itself
is not, a reaped child is gone."""

import os
import subprocess

from torchtitan.launcher import workers


def test_workers_lists_a_child_and_not_itself():
    child = subprocess.Popen(["sleep", "5"])
    try:
        found = workers(os.getpid())
        assert child.pid in found
        assert os.getpid() not in found
    finally:
        child.kill()
        child.wait()
    assert child.pid not in workers(os.getpid())  # reaped: gone from /proc
