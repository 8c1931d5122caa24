"""The checkpoint I/O gloo group exists only once a checkpoint is saved or loaded: a run that
does neither never needs gloo to reach every node."""

from types import SimpleNamespace

import torch.distributed as dist

from torchtitan.checkpoint.manager import CheckpointManager
from torchtitan.config.job_config import Checkpoint


def test_group_created_at_first_use_only(tmp_path, gloo_world, monkeypatch):
    created = []
    real = dist.new_group
    monkeypatch.setattr(dist, "new_group", lambda *a, **k: created.append(k) or real(*a, **k))
    mgr = CheckpointManager(
        Checkpoint(enable=False),
        str(tmp_path),
        [],
        {"model": "llama3/tiny"},
        optimizers=SimpleNamespace(optimizers=[], schedulers=[]),
        train_state=SimpleNamespace(),
    )
    assert mgr.load() == "" and created == []  # nothing to load: no group
    mgr.maybe_save(1, last=True)  # checkpointing off, no export: no group
    assert created == []
    group = mgr.pg
    assert created == [{"backend": "gloo", "timeout": mgr._io_timeout}] and mgr.pg is group
