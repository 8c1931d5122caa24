"""Tokenizer and dataset checks that read the inputs (torch-free), run before any process group."""

from torchtitan.config.job_config import JobConfig


def check_data_inputs(cfg: JobConfig, args) -> None:
    """Placeholder: filled in by the data-input checks (issue 12, item 5)."""
