"""Shared set-up for the unit tests: import path, offline mode, common fixtures."""

import contextlib
import datetime
import os
import socket
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

# The unit tests never need the network: make any accidental hub access fail fast.
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def repo_root() -> str:
    return REPO_ROOT


def _free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def gloo_world():
    """A 1-rank gloo default process group in this process for one test module (destroyed
    after it, so that the next module can create its own). A group that cannot be created
    fails the tests that need it, as does one left behind by an earlier test: a skip would
    hide a broken loopback or a leaked group."""
    import torch.distributed as dist

    if not dist.is_available():
        pytest.skip("torch.distributed is not available in this build")
    if dist.is_initialized():
        pytest.fail(
            "a default process group already exists in this process: an earlier test created it and did"
            " not destroy it",
            pytrace=False,
        )
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{_free_port()}",
            rank=0,
            world_size=1,
            timeout=datetime.timedelta(seconds=30),
        )
    except Exception as e:  # e.g. no loopback networking
        pytest.fail(
            f"cannot create a 1-rank gloo process group on 127.0.0.1: {type(e).__name__}: {e}",
            pytrace=False,
        )
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()
