"""Configuration: dataclasses (job_config), TOML + CLI loading (manager), checks (validate)."""

import sys

from torchtitan.config.job_config import JobConfig
from torchtitan.config.manager import ConfigError, build_config
from torchtitan.config.validate import validate


def load_config(argv: list[str], world_size: int) -> tuple[JobConfig, list[str]]:
    """Parse and validate; raises ConfigError (one line) on any problem."""
    cfg, warnings = build_config(argv)
    validate(cfg, world_size)
    return cfg, warnings


def load_config_or_exit(argv: list[str], world_size: int, quiet: bool = False) -> JobConfig:
    """Like load_config, but prints `error: <line>` and exits 2 (used by entry points)."""
    try:
        cfg, warnings = load_config(argv, world_size)
    except ConfigError as e:
        if not quiet:
            print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if not quiet:
        for w in warnings:
            print(f"warning: {w}", file=sys.stderr)
    return cfg


__all__ = ["JobConfig", "ConfigError", "build_config", "validate", "load_config", "load_config_or_exit"]
