"""Configuration: every key with its documentation (job_config) and TOML + CLI loading
(manager). Torch-free, and it imports nothing else of ours: the checks live in
torchtitan/checks, each rule with the code that owns it."""

from torchtitan.config.job_config import JobConfig
from torchtitan.config.manager import ConfigError, build_config

__all__ = ["JobConfig", "ConfigError", "build_config"]
