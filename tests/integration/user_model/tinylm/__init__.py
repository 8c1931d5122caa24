"""Registers the model (torch-free: the pre-launch checks import this before torch)."""

from torchtitan.models.registry import ModelEntry, register

from tinylm.args import FLAVORS

register("tinylm", ModelEntry(FLAVORS, "tinylm"))
