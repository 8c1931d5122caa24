"""Dense bf16 peak TFLOPS of one GPU, from its exact name (torch.cuda.get_device_name()).

Names are matched by whole tokens, not substrings: "L4" must not catch "L40", and an H100's
PCIe and NVL versions run at other clocks and power than the SXM one. Figures are NVIDIA's
datasheet values without sparsity. A GPU missing here gets no MFU (the run says so once);
--metrics.peak_tflops sets the figure by hand. Torch-free, so the table is unit-tested alone.
"""

import re

# (model token, form factor) -> dense bf16 TFLOPS; form factor "" = SXM / the only version.
PEAK_BF16_TFLOPS: dict[tuple[str, str], float] = {
    ("B200", ""): 2250.0,
    ("GB200", ""): 2500.0,
    ("H200", ""): 989.5,
    ("H200", "NVL"): 835.5,
    ("GH200", ""): 989.5,
    ("H100", ""): 989.5,
    ("H100", "PCIE"): 756.5,
    ("H100", "NVL"): 835.5,
    ("H800", ""): 989.5,
    ("H800", "PCIE"): 756.5,
    ("A100", ""): 312.0,
    ("A100", "PCIE"): 312.0,
    ("A800", ""): 312.0,
    ("A800", "PCIE"): 312.0,
    ("L40S", ""): 362.05,
    ("L40", ""): 181.05,
    ("L4", ""): 121.0,
    ("A10", ""): 125.0,
}
_FORM_FACTORS = ("PCIE", "NVL")


def peak_bf16_tflops(device_name: str) -> float | None:
    """e.g. "NVIDIA H100 80GB HBM3" -> 989.5, "NVIDIA H100 PCIe" -> 756.5, "NVIDIA L40" -> 181.0;
    None for a name the table does not hold."""
    tokens = [t for t in re.split(r"[\s\-_/]+", device_name.upper()) if t]
    form = next((t for t in tokens if t in _FORM_FACTORS), "")
    models = {m for m, _ in PEAK_BF16_TFLOPS}
    model = next((t for t in tokens if t in models), None)
    if model is None:
        return None
    return PEAK_BF16_TFLOPS.get((model, form))
