"""The pre-launch checks: every key, degree, shape, input and output of a job, before any
process group exists. Torch-free; one `ConfigError` line per problem, naming the key and the
fix.

Each rule is stated once, in the torch-free module of the code that owns it (the degrees in
distributed/job_shape.py, the pipeline split in distributed/pipeline_layout.py, a checkpoint
folder in checkpoint/files.py, ...); the modules here call them in order and turn their
errors into lines that name the keys. run_train.sh runs them once (`python -m
torchtitan.checks`) and every worker again at start-up.
"""

import logging

from torchtitan.checks.job import check_job
from torchtitan.checks.optimizer import early_step_clip_warning
from torchtitan.config import ConfigError, JobConfig, build_config
from torchtitan.resilience import exit_status

logger = logging.getLogger(__name__)


def load_config(argv: list[str], world_size: int) -> tuple[JobConfig, list[str]]:
    """Parse and check; raises ConfigError (one line) on any problem."""
    cfg, warnings = build_config(argv)
    check_job(cfg, world_size)
    clip = early_step_clip_warning(cfg)
    return cfg, warnings + ([clip] if clip else [])


def load_config_or_exit(argv: list[str], world_size: int, quiet: bool = False) -> JobConfig:
    """Like load_config, but prints `error: <line>` and exits 2 (used by entry points)."""
    try:
        cfg, warnings = load_config(argv, world_size)
    except ConfigError as e:
        # every rank tells the launcher why (the status file): the first rank to exit may be
        # a quiet one, and the launcher may stop rank 0 before it prints
        exit_status.record(exit_status.EXIT_BAD_INPUT, str(e))
        if not quiet:
            logger.error(f"error: {e}")
        raise SystemExit(2) from None
    if not quiet:
        for w in warnings:
            logger.warning(f"warning: {w}")
    return cfg


__all__ = ["check_job", "load_config", "load_config_or_exit"]
