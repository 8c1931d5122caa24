"""Rotary position embedding with Llama-3.1 frequency scaling, in real arithmetic.

Real cos/sin (not complex) keeps the cache an ordinary float buffer, which FSDP, DTensor
and torch.compile treat like any other tensor.
"""

import math

import torch


def rope_frequencies(
    head_dim: int, theta: float, scaling: bool, factor: float = 8.0
) -> torch.Tensor:
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if not scaling:
        return freqs
    # Llama 3.1 / 3.2: slow down the low frequencies (long wavelengths) by `factor`, keep the
    # high ones, and blend linearly in between.
    low_ff, high_ff, old_ctx = 1.0, 4.0, 8192
    low_wavelen, high_wavelen = old_ctx / low_ff, old_ctx / high_ff
    wavelen = 2 * math.pi / freqs
    smooth = ((old_ctx / wavelen) - low_ff) / (high_ff - low_ff)
    blended = (1 - smooth) * freqs / factor + smooth * freqs
    out = torch.where(wavelen > low_wavelen, freqs / factor, blended)
    return torch.where(wavelen < high_wavelen, freqs, out)


def rope_cache(
    seq_len: int, head_dim: int, theta: float, scaling: bool, device=None, *, factor: float = 8.0
) -> torch.Tensor:
    """[seq_len, head_dim]: cos of every (position, frequency) pair, then sin."""
    freqs = rope_frequencies(head_dim, theta, scaling, factor).to(device)
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float64), freqs)
    return torch.cat([angles.cos(), angles.sin()], dim=-1).float()


def apply_rope(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent pairs of x [batch, seq, heads, head_dim] by the angles of `rows`, the
    cache rows of its tokens' positions ([seq, head_dim]: attention.AttentionInputs.rope)."""
    seq, half = x.shape[1], x.shape[-1] // 2
    cos = rows[:seq, :half].view(1, seq, 1, half)  # [:seq]: the whole cache may be given too
    sin = rows[:seq, half:].view(1, seq, 1, half)
    pairs = x.float().unflatten(-1, (half, 2))
    x0, x1 = pairs[..., 0], pairs[..., 1]
    out = torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1)
    return out.flatten(-2).type_as(x)
