"""Shared set-up for the unit tests: import path, offline mode, common fixtures."""

import os
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


@pytest.fixture(scope="session")
def subprocess_env() -> dict:
    """Environment for `python -m torchtitan...` children: the repo importable, nothing else set."""
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for key in ("NGPU", "WORLD_SIZE", "RANK"):
        env.pop(key, None)
    return env
