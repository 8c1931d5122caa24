"""A job.custom_config_module for tests: one new section, one key added to [training] and
another default for training.steps (the shape of upstream's own example extension)."""

from dataclasses import dataclass, field


@dataclass
class Weather:
    """A section the extension adds."""

    sky: str = "clear"
    """How the sky looks."""

    days: int = 7
    """Days of forecast."""


@dataclass
class Training:
    steps: int = 99
    """Steps (the extension's default)."""

    my_custom_steps: int = 32
    """A key the extension adds to [training]."""


@dataclass
class JobConfig:
    weather: Weather = field(default_factory=Weather)
    training: Training = field(default_factory=Training)
