"""MFU inputs: the GPU peak table (exact names, form factors) and the FLOP count convention;
the memory keys."""

import pytest
import torch

from torchtitan.components.metrics import memory_stats
from torchtitan.components.peak_flops import peak_bf16_tflops


@pytest.mark.parametrize("name, tflops", [
    ("NVIDIA H100 80GB HBM3", 989.5),  # SXM
    ("NVIDIA H100 PCIe", 756.5),
    ("NVIDIA H100 NVL", 835.5),
    ("NVIDIA H200", 989.5),
    ("NVIDIA H200 NVL", 835.5),
    ("NVIDIA H800", 989.5),
    ("NVIDIA A100-SXM4-80GB", 312.0),
    ("NVIDIA A100 80GB PCIe", 312.0),
    ("NVIDIA B200", 2250.0),
    ("NVIDIA L4", 121.0),
    ("NVIDIA L40", 181.05),  # not L4's figure: whole tokens, not substrings
    ("NVIDIA L40S", 362.05),
    ("NVIDIA A10", 125.0),
    ("NVIDIA A10G", None),  # not A10's datasheet part: unknown rather than wrong
    ("NVIDIA GeForce RTX 4090", None),
    ("Tesla V100-SXM2-32GB", None),
])
def test_peak_tflops_by_exact_device_name(name, tflops):
    assert peak_bf16_tflops(name) == tflops


def test_llama3_8b_flops_follow_torchtitans_convention():
    from torchtitan.models.llama3.model import Transformer
    from torchtitan.models.flavors import MODEL_FLAVORS

    args = MODEL_FLAVORS["llama3"]["8B"]
    with torch.device("meta"):
        model = Transformer(args)
    n = sum(p.numel() for p in model.parameters())
    assert n == 8_030_261_248  # the published 8B
    seq = 8192
    # 6 N (without the embedding) + 12 * layers * heads * head_dim * seq, no causal halving
    expected = 6 * (n - 128256 * 4096) + 12 * 32 * 32 * 128 * seq
    assert model.flops_per_token(seq) == expected


def test_cpu_memory_is_the_resident_set_under_its_own_key():
    stats = memory_stats(torch.device("cpu"))
    assert list(stats) == ["memory_rss_gib"] and 0.01 < stats["memory_rss_gib"] < 64


def test_llama_3_2_flavors_have_the_published_shapes():
    from torchtitan.models.flavors import MODEL_FLAVORS
    from torchtitan.models.llama3.model import Transformer

    for flavor, published in (("1B", 1_235_814_400), ("3B", 3_212_749_824)):  # Hugging Face counts, tied output
        args = MODEL_FLAVORS["llama3"][flavor]
        assert args.ffn_hidden_dim == 8192 and args.rope_factor == 32.0
        with torch.device("meta"):
            model = Transformer(args)
        untied = sum(p.numel() for p in model.parameters())
        assert untied - model.output.weight.numel() == published, (flavor, untied)
