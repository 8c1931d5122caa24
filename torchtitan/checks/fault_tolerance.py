"""[fault_tolerance]: torchft replica groups (training/fault_tolerance.py), each bad input
refused in one line before launch. Torch-free (the lighthouse is reached with a plain socket).

What runs: G replica groups of the same layout (any the framework has: FSDP2, SimpleFSDP, TP,
PP, CP, EP inside a group), averaged every step over the groups alive, or every sync_steps
with LocalSGD or DiLoCo (training/semi_sync.py). Refused: torchft not
installed; replica_id outside the groups; min_replica_size outside 1..group_size; the
replicate dimension inside a group (the groups are it); NCCL between groups of CPU ranks;
semi-synchronous training's keys out of range (sync_steps not a multiple of num_fragments,
fragments without DiLoCo or with PP, the outer SGD's keys); the lighthouse not reachable
(after a bounded wait, naming the address).
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
    if f.sync_steps < 1 or f.num_fragments < 1 or f.sync_steps % f.num_fragments:
        raise ConfigError(
            f"{FT}.sync_steps={f.sync_steps}: must be a positive multiple of"
            f" {FT}.num_fragments={f.num_fragments} (torchft syncs one fragment at a time)"
        )
    diloco = f.semi_sync_method == "diloco"
    fragmented = f.num_fragments > 1 or f.module_fqns_per_model_fragment
    if fragmented and not diloco:
        raise ConfigError(
            f"{FT}.num_fragments={f.num_fragments}: fragments are DiLoCo's; set"
            f" {FT}.semi_sync_method=diloco, or 1 fragment"
        )
    per_fragment = f.sync_steps // f.num_fragments
    if not 0 <= f.fragment_sync_delay < per_fragment:
        raise ConfigError(
            f"{FT}.fragment_sync_delay={f.fragment_sync_delay}: must be in 0..{per_fragment - 1}"
            f" (a fragment syncs every sync_steps / num_fragments = {per_fragment} steps)"
        )
    if not 0.0 <= f.fragment_update_alpha <= 1.0:
        raise ConfigError(f"{FT}.fragment_update_alpha={f.fragment_update_alpha}: must be in 0..1")
    if f.module_fqns_per_model_fragment and (
        len(f.module_fqns_per_model_fragment) != f.num_fragments
    ):
        raise ConfigError(
            f"{FT}.module_fqns_per_model_fragment: {len(f.module_fqns_per_model_fragment)}"
            f" lists for {FT}.num_fragments={f.num_fragments}; give one list per fragment"
        )
    if fragmented and cfg.parallelism.pipeline_parallel_degree > 1:
        raise ConfigError(
            f"{FT}.num_fragments={f.num_fragments} with --parallelism.pipeline_parallel_degree="
            f"{cfg.parallelism.pipeline_parallel_degree}: a stage would hold no part of some"
            " fragment; use 1 fragment with pipeline parallel"
        )
    if f.fragment_sync_delay and cfg.checkpoint.enable:
        raise ConfigError(
            f"{FT}.fragment_sync_delay={f.fragment_sync_delay} with --checkpoint.enable: a"
            " fragment's all-reduce would be in flight at a save; use 0 with checkpoints"
        )
    if diloco and f.outer_lr <= 0:
        raise ConfigError(f"{FT}.outer_lr={f.outer_lr}: must be > 0")
    if diloco and not 0.0 <= f.outer_momentum < 1.0:
        raise ConfigError(f"{FT}.outer_momentum={f.outer_momentum}: must be in [0, 1)")
    if diloco and f.outer_nesterov and f.outer_momentum == 0:
        raise ConfigError(
            f"{FT}.outer_nesterov=true with {FT}.outer_momentum=0: Nesterov needs momentum;"
            " set outer_momentum > 0 or outer_nesterov=false"
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
