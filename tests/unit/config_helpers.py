"""Helpers shared by the config tests."""

import textwrap

import pytest

from torchtitan.checks import load_config
from torchtitan.config import ConfigError, build_config


def config_error(argv, world_size=1) -> str:
    """The ConfigError message load_config raises for argv; it must be a single line."""
    with pytest.raises(ConfigError) as info:
        load_config(argv, world_size)
    msg = str(info.value)
    assert "\n" not in msg and "\r" not in msg, msg
    assert msg.strip() == msg and msg
    return msg


def write_toml(tmp_path, text: str, name: str = "job.toml") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def cfg_of(argv):
    cfg, warnings = build_config(argv)
    assert warnings == []
    return cfg
