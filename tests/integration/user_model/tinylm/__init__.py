"""Registers the model (torch-free: the pre-launch checks import this before torch)."""

from tinylm.args import FLAVORS
from torchtitan.models.registry import ModelEntry, register

register("tinylm", ModelEntry(FLAVORS, "tinylm"))
