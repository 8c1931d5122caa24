"""[fault_tolerance]: torchft replica groups (training/fault_tolerance.py), each bad input
refused in one line before launch. Torch-free (the lighthouse is reached with a plain socket).

What runs: G replica groups of the same layout (any the framework has: FSDP2, SimpleFSDP, TP,
PP, CP, EP inside a group), averaged every step over the groups alive. Refused: torchft not
installed; replica_id outside the groups; min_replica_size outside 1..group_size; the
replicate dimension inside a group (the groups are it); NCCL between groups of CPU ranks;
semi-synchronous training (LocalSGD, DiLoCo: not in this fork yet); the lighthouse not
reachable (after a bounded wait, naming the address).
"""

import importlib.util
import os
import socket
import time
from urllib.parse import urlparse

from torchtitan.checks.compile_keys import on_cpu
from torchtitan.config.job_config import JobConfig
from torchtitan.config.manager import ConfigError

FT = "--fault_tolerance"
INSTALL = "pip install -e '.[ft]' (torchft, an optional extra)"
LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"
LIGHTHOUSE_WAIT_S = 10.0  # how long a launch waits for the lighthouse to listen
SEMI_SYNC = ("local_sgd", "diloco")


def check_fault_tolerance(cfg: JobConfig) -> None:
    """Raise ConfigError for the first [fault_tolerance] key that cannot run (module
    docstring); the lighthouse is checked last (check_lighthouse_of)."""
    f, p = cfg.fault_tolerance, cfg.parallelism
    if not f.enable:
        return
    if importlib.util.find_spec("torchft") is None:
        raise ConfigError(f"{FT}.enable: torchft is not installed; {INSTALL}")
    if f.group_size < 1:
        raise ConfigError(
            f"{FT}.group_size={f.group_size}: must be >= 1 (the number of replica groups)"
        )
    if not 0 <= f.replica_id < f.group_size:
        raise ConfigError(
            f"{FT}.replica_id={f.replica_id}: must be in 0..{f.group_size - 1}"
            f" ({FT}.group_size={f.group_size} replica groups)"
        )
    if not 1 <= f.min_replica_size <= f.group_size:
        raise ConfigError(
            f"{FT}.min_replica_size={f.min_replica_size}: must be in 1..{f.group_size} (the"
            f" fewest of the {FT}.group_size={f.group_size} replica groups that train on)"
        )
    if p.data_parallel_replicate_degree > 1:
        raise ConfigError(
            f"--parallelism.data_parallel_replicate_degree={p.data_parallel_replicate_degree}"
            f" with {FT}.enable: the replica groups are the replicate dimension; set it to 1"
            f" and start {FT}.group_size groups"
        )
    if f.process_group not in ("gloo", "nccl"):
        raise ConfigError(f"{FT}.process_group={f.process_group}: use gloo or nccl")
    if f.process_group == "nccl" and on_cpu(cfg):
        raise ConfigError(
            f"{FT}.process_group=nccl: the ranks train on CPU; use gloo between CPU groups"
        )
    if f.process_group_timeout_ms < 1:
        raise ConfigError(
            f"{FT}.process_group_timeout_ms={f.process_group_timeout_ms}: must be >= 1"
        )
    if f.semi_sync_method:
        check_semi_sync(cfg)


def check_lighthouse_of(cfg: JobConfig, environ=os.environ) -> None:
    """A fault-tolerant launch's lighthouse (last of the checks: it may wait; a dry run has
    none)."""
    if cfg.fault_tolerance.enable and not cfg.job.dry_run:
        check_lighthouse(environ)


def check_semi_sync(cfg: JobConfig) -> None:
    f = cfg.fault_tolerance
    if f.semi_sync_method not in SEMI_SYNC:
        raise ConfigError(
            f"{FT}.semi_sync_method={f.semi_sync_method}: use {' or '.join(SEMI_SYNC)}, or leave"
            " it empty (every step synchronous)"
        )
    if f.num_fragments < 1 or f.sync_steps < 1 or f.sync_steps % f.num_fragments:
        raise ConfigError(
            f"{FT}.sync_steps={f.sync_steps}: must be a positive multiple of"
            f" {FT}.num_fragments={f.num_fragments} (torchft syncs one fragment at a time)"
        )
    raise ConfigError(
        f"{FT}.semi_sync_method={f.semi_sync_method}: LocalSGD and DiLoCo are not in this fork"
        " yet; leave it empty (every step averaged over the replica groups)"
    )


def check_lighthouse(environ=os.environ, wait_s: float = LIGHTHOUSE_WAIT_S) -> None:
    """The lighthouse torchft's manager will join listens (a TCP connection within `wait_s`)."""
    addr = environ.get(LIGHTHOUSE_ENV, "")
    if not addr:
        raise ConfigError(
            f"{FT}.enable: {LIGHTHOUSE_ENV} is not set; set it to the lighthouse's address"
            " (http://host:port; scripts/ft_local.py starts one and sets it)"
        )
    url = urlparse(addr if "://" in addr else f"http://{addr}")
    if url.hostname is None or url.port is None:
        raise ConfigError(f"{LIGHTHOUSE_ENV}={addr}: give the lighthouse as http://host:port")
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with socket.create_connection((url.hostname, url.port), timeout=1.0):
                return
        except OSError:
            if time.monotonic() >= deadline:
                raise ConfigError(
                    f"{LIGHTHOUSE_ENV}={addr}: no lighthouse answers there (waited"
                    f" {wait_s:.0f} s); start it (torchft_lighthouse --bind [::]:{url.port}"
                    " --min_replicas 1) or fix the address"
                ) from None
            time.sleep(0.2)
