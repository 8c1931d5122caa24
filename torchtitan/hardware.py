"""Hardware profiles: what the step-time model (step_time.py) turns FLOPs and bytes into time with.

A profile holds datasheet figures (peak FLOPS, memory bandwidth, link bandwidths, GPUs per
node) and a few efficiencies: the fraction of a peak that a class of kernels reaches. The
datasheet figures are NVIDIA's (sources below, dense, no sparsity). The efficiencies are
fixed from public micro-benchmark knowledge, not fitted to the runs we compare against,
except the one calibration docs/step_time.md names (the GEMM efficiency of
`h100_grand_teton`, from one published run).

`local` is this machine, measured by a short micro-benchmark (memory/local_profile.py) and
cached per machine; every other profile is a constant here. `[hardware]` keys override
single values (config/job_config.py, class Hardware). Torch-free: the config check and the
layout search use it without torch.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import subprocess
from dataclasses import dataclass, field

GB = 1e9  # link and memory bandwidths are decimal GB/s, as datasheets state them


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    source: str  # where the figures come from
    peak_tflops: dict[str, float]  # dense peak per compute dtype ("bfloat16", "float32")
    hbm_gbps: float  # device memory bandwidth, GB/s
    memory_gib: float  # device memory
    gpus_per_node: int  # ranks that share the fast intra-node links (NVLink; CPU: one machine)
    intra_node_gbps: float  # achievable collective bus bandwidth per rank inside a node, GB/s
    inter_node_gbps: float  # achievable bus bandwidth per rank across nodes (its NIC), GB/s
    intra_latency_us: float  # per ring step of a collective inside a node
    inter_latency_us: float  # per ring step across nodes
    # fraction of peak FLOPS a large GEMM reaches, and the GEMM size (GFLOP) at which it
    # reaches half of that (small GEMMs do not fill the machine): eff = gemm * f / (f + half)
    gemm_efficiency: float
    gemm_half_gflop: float
    grouped_gemm_efficiency: float  # routed experts' grouped GEMM, as a fraction of peak
    attention_efficiency: float  # fused attention (flash / memory-efficient kernels)
    attention_block: (
        int  # query/key block of the causal kernel: blocks above the diagonal are skipped
    )
    memory_efficiency: float  # fraction of hbm_gbps that memory-bound kernels reach
    host_us_per_op: float  # eager: host time to dispatch one op (Python, autograd, launch)
    dtensor_us_per_op: (
        float  # host time DTensor adds to an op on DTensors (sharding propagation, Python)
    )
    host_us_per_collective: (
        float  # host time around an eager process-group collective (FSDP2's hooks, copies)
    )
    # compiled blocks: memory-bound ops fuse (fewer bytes move, fewer launches)
    compiled_memory_fraction: float  # bytes a compiled block's memory-bound ops still move
    compiled_ops_per_kernel: float  # eager ops per launched kernel in a compiled block
    # GPUs queue kernels: an op costs max(host, device); a CPU runs the op on the thread that
    # dispatched it: host + device
    host_async: bool = True
    cores: int = 0  # CPU: cores the node's ranks share (ranks beyond it slow compute down)
    thread_speedup: float = 1.0  # CPU: a rank with every core's thread vs one thread
    sharing: dict = field(
        default_factory=dict
    )  # CPU: {processes: slowdown of each} when they compute at once
    # host time activation checkpointing adds per op of a checkpointed region (forward and
    # recomputation): whole-region checkpointing (saved-tensor hooks) and an op-level policy
    # (SAC's dispatch modes); measured on a CPU, 0 where not measured
    ac_us_per_op: float = 0.0
    sac_us_per_op: float = 0.0
    # sustained fraction of the boost clock the tensor cores hold (a power cap lowers it)
    clock_factor: float = 1.0
    # measured profiles: attention's efficiency by head dim (log-interpolated; else attention_efficiency)
    attention_by_head_dim: dict[int, float] = field(default_factory=dict)
    # measured profiles (gloo on one machine): {ranks on the machine: {"gbps", "fixed_us": {kind: us}}}
    gloo: dict = field(default_factory=dict)

    def attention_eff(self, head_dim: int) -> float:
        table = sorted((int(k), v) for k, v in self.attention_by_head_dim.items())
        if not table:
            return self.attention_efficiency
        if head_dim <= table[0][0]:
            return table[0][1]
        for (d0, e0), (d1, e1) in zip(table, table[1:]):
            if head_dim <= d1:
                return e0 + (e1 - e0) * math.log(head_dim / d0) / math.log(d1 / d0)
        return table[-1][1]

    collective_us: dict[str, float] = field(
        default_factory=dict
    )  # CPU (gloo): fixed cost per collective kind

    def peak_flops(self, dtype: str) -> float:
        return self.peak_tflops.get(dtype, self.peak_tflops["bfloat16"]) * 1e12 * self.clock_factor

    def record(self) -> dict:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------- the GPUs
# Sources (dense figures, no sparsity):
#  H100 SXM5: NVIDIA H100 Tensor Core GPU datasheet (2023): bf16 989.4 TFLOPS, fp32 66.9,
#    HBM3 3.35 TB/s, 80 GB, NVLink 4 900 GB/s (both directions: 450 per direction).
#  H200 SXM: NVIDIA H200 datasheet (2024): bf16 989.4, HBM3e 4.8 TB/s, 141 GB, NVLink 900 GB/s.
#  A100 SXM 80GB: NVIDIA A100 datasheet (2021): bf16 312, fp32 19.5, HBM2e 2.039 TB/s,
#    NVLink 3 600 GB/s (300 per direction).
#  B200 (HGX): NVIDIA Blackwell datasheet (2024): bf16 2,250 dense, HBM3e 8 TB/s, 180 GB,
#    NVLink 5 1.8 TB/s (900 per direction).
# Networks: one 400 Gb/s NIC per GPU (ConnectX-7 InfiniBand / RoCE, the HGX reference
# design; A100: 200 Gb/s HDR) = 50 GB/s per direction.
# Efficiencies, from public measurements on these parts: NCCL all-gather / reduce-scatter bus
# bandwidth ~80% of NVLink's per-direction figure (nccl-tests on HGX H100: ~360 of 450 GB/s) and
# ~85% of the NIC's; cuBLAS bf16 GEMMs of LLM shapes ~70% of peak on H100 (~75% on A100);
# FlashAttention-2 (torch's SDPA kernels) ~40% of peak on H100 forward and backward, ~55%
# on A100; elementwise kernels ~80% of HBM bandwidth; eager PyTorch dispatches an op in
# ~10 us of host time (Python module call, autograd, launch), DTensor adds ~40 us per op
# (sharding propagation) and FSDP2 ~150 us around each collective (its hooks and copies) on
# a server CPU (about 2.5x faster than this project's CPU machines, where they measure ~95
# and ~250-400 us: memory/local_profile.py).
_GPU_COMMON = dict(
    intra_latency_us=5.0,
    inter_latency_us=15.0,
    gemm_half_gflop=2.0,
    attention_block=128,
    memory_efficiency=0.8,
    host_us_per_op=10.0,
    dtensor_us_per_op=40.0,
    host_us_per_collective=150.0,
    compiled_memory_fraction=0.5,
    compiled_ops_per_kernel=4.0,
    host_async=True,
)

PROFILES: dict[str, HardwareProfile] = {
    "h100_sxm": HardwareProfile(
        "h100_sxm",
        "NVIDIA H100 SXM5 80GB datasheet; 8 per HGX node, 400 Gb/s NIC per GPU",
        {"bfloat16": 989.4, "float32": 66.9},
        hbm_gbps=3350,
        memory_gib=80 * 1e9 / 2**30,
        gpus_per_node=8,
        intra_node_gbps=360,
        inter_node_gbps=42.5,
        gemm_efficiency=0.70,
        grouped_gemm_efficiency=0.55,
        attention_efficiency=0.40,
        **_GPU_COMMON,
    ),
    "h200": HardwareProfile(
        "h200",
        "NVIDIA H200 SXM 141GB datasheet; 8 per HGX node, 400 Gb/s NIC per GPU",
        {"bfloat16": 989.4, "float32": 66.9},
        hbm_gbps=4800,
        memory_gib=141 * 1e9 / 2**30,
        gpus_per_node=8,
        intra_node_gbps=360,
        inter_node_gbps=42.5,
        gemm_efficiency=0.72,
        grouped_gemm_efficiency=0.57,
        attention_efficiency=0.42,
        **_GPU_COMMON,
    ),
    "a100_80gb": HardwareProfile(
        "a100_80gb",
        "NVIDIA A100 SXM4 80GB datasheet; 8 per HGX node, 200 Gb/s NIC per GPU",
        {"bfloat16": 312.0, "float32": 19.5},
        hbm_gbps=2039,
        memory_gib=80 * 1e9 / 2**30,
        gpus_per_node=8,
        intra_node_gbps=240,
        inter_node_gbps=21.25,
        gemm_efficiency=0.75,
        grouped_gemm_efficiency=0.60,
        attention_efficiency=0.55,
        **_GPU_COMMON,
    ),
    "b200": HardwareProfile(
        "b200",
        "NVIDIA HGX B200 180GB datasheet; 8 per node, 400 Gb/s NIC per GPU",
        {"bfloat16": 2250.0, "float32": 80.0},
        hbm_gbps=8000,
        memory_gib=180 * 1e9 / 2**30,
        gpus_per_node=8,
        intra_node_gbps=720,
        inter_node_gbps=42.5,
        gemm_efficiency=0.65,
        grouped_gemm_efficiency=0.50,
        attention_efficiency=0.35,
        **_GPU_COMMON,
    ),
    # The hardware of torchtitan's published Llama 3.1 benchmarks (Grand Teton: H100 SXM with
    # 96 GB HBM2e at 2.4 TB/s and a 500 W power limit, 8 per host over NVLink, 400 Gb/s RDMA
    # per GPU). Same silicon and efficiencies as h100_sxm; the 500 W cap lowers the sustained
    # tensor-core clock: `clock_factor` is the one value calibrated on a published run
    # (docs/step_time.md names the run; CALIBRATED_CLOCK below).
    "h100_grand_teton": HardwareProfile(
        "h100_grand_teton",
        "H100 SXM 96GB HBM2e 2.4 TB/s, 500 W (torchtitan's published benchmarks' hardware)",
        {"bfloat16": 989.4, "float32": 66.9},
        hbm_gbps=2400,
        memory_gib=96 * 1e9 / 2**30,
        gpus_per_node=8,
        intra_node_gbps=360,
        inter_node_gbps=42.5,
        gemm_efficiency=0.70,
        grouped_gemm_efficiency=0.55,
        attention_efficiency=0.40,
        clock_factor=0.762,
        **_GPU_COMMON,
    ),
}
PROFILES["h800"] = dataclasses.replace(  # H100 with NVLink cut to 400 GB/s (export part)
    PROFILES["h100_sxm"],
    name="h800",
    source="NVIDIA H800 SXM: H100 silicon, NVLink 400 GB/s; 8 per node, 400 Gb/s NIC per GPU",
    intra_node_gbps=160,
)

NAMES = (*PROFILES, "local")

# [hardware] keys that override one value of the chosen profile
OVERRIDES = {
    "gpus_per_node": "gpus_per_node",
    "peak_tflops": "peak_tflops",
    "hbm_gbps": "hbm_gbps",
    "intra_node_gbps": "intra_node_gbps",
    "inter_node_gbps": "inter_node_gbps",
    "gemm_efficiency": "gemm_efficiency",
    "clock_factor": "clock_factor",
}


def gpu_profile_name(device_name: str) -> str | None:
    """The profile of a GPU by its name (torch.cuda.get_device_name / nvidia-smi), None if none fits."""
    upper = device_name.upper()
    for token, name in (
        ("H200", "h200"),
        ("H800", "h800"),
        ("H100", "h100_sxm"),
        ("A100", "a100_80gb"),
        ("B200", "b200"),
    ):
        if token in upper:
            return name
    return None


def with_overrides(profile: HardwareProfile, hw) -> HardwareProfile:
    """`profile` with every [hardware] key that is not "auto" applied (hw: config.Hardware)."""
    changes = {}
    for key, attr in OVERRIDES.items():
        value = getattr(hw, key, "auto")
        if value == "auto":
            continue
        if attr == "peak_tflops":
            value = {**profile.peak_tflops, "bfloat16": float(value)}
        changes[attr] = value
    return dataclasses.replace(profile, **changes) if changes else profile


def resolve(
    hw, target: str, local=None, gpu_names: list[str] | None = None
) -> HardwareProfile | None:
    """The profile a job is predicted for ([hardware] section `hw`, its target "cpu" / "cuda"):
    `local` comes from `local()` (None: not measured, no prediction); `gpu_names`: the visible
    GPUs' names for "auto" on a GPU job."""
    name = hw.profile
    if name == "auto":
        name = (
            "local"
            if target == "cpu"
            else next((n for n in map(gpu_profile_name, gpu_names or []) if n), "h100_sxm")
        )
    profile = (local() if local is not None else None) if name == "local" else PROFILES[name]
    return None if profile is None else with_overrides(profile, hw)


# nvidia-smi: the one place the framework asks the driver about its GPUs (torch-free)


def _nvidia_smi(query: str) -> list[str] | None:
    """One line per GPU nvidia-smi lists for `query` (CUDA_VISIBLE_DEVICES respected); None
    when there is no nvidia-smi or it fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    cmd = [exe, f"--query-gpu={query}", "--format=csv,noheader,nounits"]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if visible:
        cmd.append(f"--id={visible}")
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return [line.strip() for line in out.splitlines() if line.strip()]


def gpu_memory_bytes() -> list[int] | None:
    """Total memory of each GPU nvidia-smi lists; [] when it lists none, None when there is no
    nvidia-smi or it fails."""
    lines = _nvidia_smi("memory.total")
    try:
        return None if lines is None else [int(float(line)) * 2**20 for line in lines]  # MiB
    except ValueError:
        return None


def gpu_names() -> list[str]:
    """Names of the GPUs nvidia-smi lists; [] without one."""
    return _nvidia_smi("name") or []
