"""Dtype names as configs spell them -> torch dtypes; the parameter-dtype rule of "auto"."""

import torch

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def param_dtype(setting: str, device_type: str) -> str:
    """training.mixed_precision_param for a job on `device_type`: "auto" is bfloat16 on CUDA
    (what its matmuls are fast in) and float32 elsewhere (CPU runs are for checking numerics)."""
    if setting != "auto":
        return setting
    return "bfloat16" if device_type == "cuda" else "float32"


def dtype_bytes(name: str) -> int:
    return DTYPES[name].itemsize
