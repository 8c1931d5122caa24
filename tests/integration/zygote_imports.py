"""Imported once per test session by the launcher's fork server (launcher.py): everything a
training run imports, so that each forked rank starts with it already loaded.

Nothing here may start threads or touch a GPU: the ranks are forked from this process.
"""

import gc
import os
import sys

if os.environ.get("TITAN_FORK_SERVER_LOG"):  # the fork server's own output (fast_launch.SERVER_LOG)
    _log = os.open(
        os.environ["TITAN_FORK_SERVER_LOG"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644
    )
    for _fd in (1, 2):
        os.dup2(_log, _fd)
    os.close(_log)
    print(f"fork server {os.getpid()}: importing", file=sys.stderr, flush=True)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# This checkout's torchtitan, whatever an editable install of the venv points at.
if sys.path[:1] != [ROOT]:
    sys.path.insert(0, ROOT)

import pydoc_data.topics  # noqa: E402,F401

# What a run imports later, inside functions: data, checkpoints, weight export, both models.
import datasets  # noqa: E402,F401
import datasets.distributed  # noqa: E402,F401
import safetensors.torch  # noqa: E402,F401
import torch  # noqa: E402,F401
import torch.distributed.checkpoint  # noqa: E402,F401
import torch.profiler._cupti_monitor  # noqa: E402,F401
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402,F401

import torchtitan.checks.data  # noqa: E402,F401
import torchtitan.dry_run  # noqa: E402,F401
import torchtitan.models.hf.folder  # noqa: E402,F401
import torchtitan.models.hf.weights  # noqa: E402,F401
import torchtitan.train  # noqa: E402,F401
from torchtitan.models.registry import MODELS  # noqa: E402
from torchtitan.models.train_spec import get_train_spec  # noqa: E402

for _name in MODELS:  # every registered model's model and parallelize modules
    get_train_spec(_name)

# Everything imported here is shared with each forked rank page for page until written: a full
# collection in a rank (the trainer's at shutdown) would walk every one of these objects and
# so copy their pages. Frozen, the collector leaves them alone (CPython's advice for a process
# that forks without exec); what a rank creates is collected as before.
gc.collect()
gc.freeze()

assert torchtitan.__file__.startswith(ROOT + os.sep), torchtitan.__file__
assert not torch.cuda.is_initialized()  # a forked child could not use CUDA
if os.environ.get("TITAN_FORK_SERVER_LOG"):
    print(f"fork server {os.getpid()}: ready", file=sys.stderr, flush=True)
