"""Helpers of the check_data_inputs tests (test_check_data.py, test_check_data_hub.py)."""

import json
import os

import pytest
from config_helpers import cfg_of

from torchtitan.checks.data import check_data_inputs
from torchtitan.config import ConfigError
from torchtitan.models.flavors import flavors_of

DEBUG = flavors_of("llama3")["debugmodel"]  # vocab_size 0: takes the tokenizer's
FIXED = flavors_of("llama3")["8B"]  # vocab_size 128256
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def check_error(argv, args=DEBUG, global_batch=0) -> str:
    """The one-line ConfigError check_data_inputs raises for argv."""
    with pytest.raises(ConfigError) as info:
        check_data_inputs(cfg_of(argv), args, global_batch)
    msg = str(info.value)
    assert "\n" not in msg and "\r" not in msg and msg.strip() == msg, msg
    assert msg.startswith(
        ("--model.tokenizer_path", "--training.dataset", "--validation.dataset")
    ), msg
    return msg


def write_jsonl(path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def docs(n, field="text"):
    return [{field: f"document {i} " * 10, "id": i} for i in range(n)]
