import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def fsdp_run(tmp_path_factory):
    """The 4-rank FSDP run (10 steps, checkpoints at steps 5 and 10; its losses kept as
    straight.jsonl): the uninterrupted reference of the checkpoint and preemption tests."""
    import checkpoint_checks as cc

    dump = str(tmp_path_factory.mktemp("ckpt") / "fsdp")
    straight = cc.straight_run("fsdp", dump)
    assert sorted(straight) == list(range(1, 11))
    return dump
