import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
# The unit tests' helper modules (config_helpers, check_data_helpers) serve the tests moved
# here from there too; appended, so that a module of this folder comes first.
UNIT = os.path.join(os.path.dirname(HERE), "unit")
if UNIT not in sys.path:
    sys.path.append(UNIT)


@pytest.fixture(scope="session")
def repo_root() -> str:
    return REPO_ROOT


@pytest.fixture(scope="session")
def subprocess_env() -> dict:
    """Environment for `python -m torchtitan...` children: the repo importable, the Hugging
    Face hub offline (as in tests/unit: an accidental hub access fails fast), nothing else set."""
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO_ROOT + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
    )
    env.setdefault("HF_DATASETS_OFFLINE", "1")
    env.setdefault("HF_HUB_OFFLINE", "1")
    for key in ("NGPU", "WORLD_SIZE", "RANK"):
        env.pop(key, None)
    return env


@pytest.fixture(scope="session")
def fsdp_run(tmp_path_factory):
    """The 4-rank FSDP run (10 steps, checkpoints at steps 5 and 10; its losses kept as
    straight.jsonl): the uninterrupted reference of the checkpoint and preemption tests."""
    import checkpoint_checks as cc

    dump = str(tmp_path_factory.mktemp("ckpt") / "fsdp")
    straight = cc.straight_run("fsdp", dump)
    assert sorted(straight) == list(range(1, 11))
    return dump
