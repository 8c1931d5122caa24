"""The one table of GPU facts: hardware profiles, what the step-time model (planning/step_time/)
turns FLOPs and bytes into time with, and the peak both MFUs divide by: the measured one of the
trainer's log (observe/metrics.py) and the predicted one (planning/step_time/roles.py).

A profile holds datasheet figures (dense peak TFLOPS per dtype, memory capacity and bandwidth,
link bandwidths, GPUs per node), the GPU names it is chosen for, and a few efficiencies: the
fraction of a peak that a class of kernels reaches. The datasheet figures are NVIDIA's (each
entry's `source`; dense, no sparsity). The efficiencies are fixed from public
micro-benchmark knowledge, not fitted to the runs we compare against, except the one
calibration docs/step_time.md names (the `clock_factor` of `h100_grand_teton`, from one
published run).

A GPU is found by its name (nvidia-smi / torch.cuda.get_device_name) and never guessed: the
name's words must be exactly those of a name an entry lists (`gpu_profile_name`), so a PCIe
H100 is not the SXM one and a GB200 is not a B200; an unknown GPU gets one line naming it and
the keys that describe it (`unknown_gpu_line`). Adding a GPU is one entry of PROFILES (and its
name in the Literal of config/job_config.py's Hardware.profile, which a test ties to PROFILES).

`local` is this machine, measured by a short micro-benchmark (planning/step_time/local_profile.py)
and cached per machine; every other profile is a constant here. `[hardware]` keys override
single values (config/job_config.py, class Hardware). Torch-free: the config check and the
layout search use it without torch.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field

GB = 1e9  # link and memory bandwidths are decimal GB/s, as datasheets state them


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    source: str  # where the figures come from
    # dense peak per compute dtype ("bfloat16", "float32", "float8": FP8 tensor cores)
    peak_tflops: dict[str, float]
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
    # query/key block of the causal kernel: blocks above the diagonal are skipped
    attention_block: int
    memory_efficiency: float  # fraction of hbm_gbps that memory-bound kernels reach
    host_us_per_op: float  # eager: host time to dispatch one op (Python, autograd, launch)
    # host time DTensor adds to an op on DTensors (sharding propagation, Python)
    dtensor_us_per_op: float
    # host time around an eager process-group collective (FSDP2's hooks, copies)
    host_us_per_collective: float
    # compiled blocks: memory-bound ops fuse (fewer bytes move, fewer launches)
    compiled_memory_fraction: float  # bytes a compiled block's memory-bound ops still move
    compiled_ops_per_kernel: float  # eager ops per launched kernel in a compiled block
    # GPUs queue kernels: an op costs max(host, device); a CPU runs the op on the thread that
    # dispatched it: host + device
    host_async: bool = True
    cores: int = 0  # CPU: cores the node's ranks share (ranks beyond it slow compute down)
    thread_speedup: float = 1.0  # CPU: a rank with every core's thread vs one thread
    # CPU: {processes: slowdown of each} when they compute at once
    sharing: dict = field(default_factory=dict)
    # host time activation checkpointing adds per op of a checkpointed region (forward and
    # recomputation): whole-region checkpointing (saved-tensor hooks) and an op-level policy
    # (SAC's dispatch modes); measured on a CPU, 0 where not measured
    ac_us_per_op: float = 0.0
    sac_us_per_op: float = 0.0
    # host time of one FSDP2 hook (pre/post forward, pre/post backward of a unit: its Python,
    # the per-parameter bookkeeping), charged per hook the trace sees run, on any mesh, a 1-rank
    # one included; measured on a CPU (the framework's own blocks), 0 where not measured (GPU
    # profiles count FSDP2's host time in host_us_per_collective)
    host_us_per_fsdp_hook: float = 0.0
    # CPU: a memory-bound op moving more than cache_bytes streams them from DRAM at dram_gbps
    # (hbm_gbps is then the last-level cache's rate, which activation-sized ops get); 0: one rate
    dram_gbps: float = 0.0
    cache_bytes: int = 0
    # CPU: the rate memory-bound ops reach inside a training step (inputs no longer in the
    # cache, outputs freshly allocated), measured per op on the calibration step
    # (cpu_bench.step_memory_rate): 2-3x below the micro-benchmark's in-cache rate on this VM.
    # Replaces hbm_gbps / dram_gbps for every memory-bound op when set; 0: not measured
    step_memory_gbps: float = 0.0
    # sustained fraction of the boost clock the tensor cores hold (a power cap lowers it)
    clock_factor: float = 1.0
    # a measured profile's one fitted constant: the framework's debug Llama3 forward + backward
    # on one thread, measured over predicted from the micro-benchmarks (local_profile.py's
    # `calibration`); scales every op's device and host time. 1 on the GPU profiles (their
    # fitted constant, where they have one, is clock_factor)
    time_factor: float = 1.0
    # measured profiles: attention's efficiency by head dim (log-interpolated; else attention_efficiency)
    attention_by_head_dim: dict[int, float] = field(default_factory=dict)
    # measured profiles (gloo on one machine): {ranks on the machine: {"gbps", "fixed_us": {kind: us}}}
    gloo: dict = field(default_factory=dict)
    # CPU (gloo): fixed cost per collective kind
    collective_us: dict[str, float] = field(default_factory=dict)
    # the GPU names (nvidia-smi, torch.cuda.get_device_name) that choose this profile under
    # --hardware.profile=auto, as the driver spells them; matched by their words (name_words)
    device_names: tuple[str, ...] = ()

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

    def datasheet_flops(self, dtype: str) -> float:
        """The dense datasheet peak of `dtype` (bf16's for a dtype the profile does not state):
        what an MFU divides by, the clock factor not applied (MFU compares with the datasheet)."""
        return self.peak_tflops.get(dtype, self.peak_tflops.get("bfloat16", 0.0)) * 1e12

    def peak_flops(self, dtype: str) -> float:
        """The peak the step-time model reaches a fraction of: the datasheet's at clock_factor."""
        return self.datasheet_flops(dtype) * self.clock_factor

    def record(self) -> dict:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------- the GPUs
# Sources (dense figures: NVIDIA's tables give sparse tensor-core figures, twice these):
#  H100 SXM5 / PCIe: NVIDIA H100 Tensor Core GPU whitepaper and datasheet (2023): bf16 989.4 /
#    756.5 TFLOPS, fp32 66.9 / 51.2, fp8 1,978.9 / 1,513; SXM5 HBM3 3.35 TB/s 80 GB, NVLink 4
#    900 GB/s (450 per direction); PCIe HBM2e 2 TB/s. H100 NVL datasheet: 94 GB HBM3 3.9 TB/s.
#  H200 SXM / NVL: NVIDIA H200 datasheet (2024): HBM3e 4.8 TB/s, 141 GB, NVLink 900 GB/s;
#    NVL bf16 1,671 sparse. H800 / A800: the export parts, NVLink 400 GB/s.
#  GH200: NVIDIA GH200 Grace Hopper Superchip datasheet (2023): 96 GB HBM3 4 TB/s or 144 GB
#    HBM3e 4.9 TB/s.
#  A100 SXM4 / PCIe: NVIDIA A100 datasheet (2021): bf16 312, fp32 19.5; 80 GB HBM2e 2.039 TB/s
#    (PCIe 1.935), 40 GB HBM2 1.555 TB/s; NVLink 3 600 GB/s (300 per direction).
#  B200 (HGX): NVIDIA Blackwell datasheet (2024): bf16 2,250 dense, fp8 4,500, HBM3e 8 TB/s,
#    180 GB, NVLink 5 1.8 TB/s (900 per direction). GB200: the GB200 NVL72 datasheet (2024).
#  L40S, L40, L4, A10: their NVIDIA datasheets (GDDR6; PCIe Gen4 x16, no NVLink).
# Networks: one 400 Gb/s NIC per GPU (ConnectX-7 InfiniBand / RoCE, the HGX reference design;
# A100: 200 Gb/s HDR) = 50 GB/s per direction. PCIe servers (8 cards): collectives cross PCIe
# (Gen5 x16 64 GB/s per direction, Gen4 32; the cards' NVLink bridges join pairs only, which
# a ring over 8 does not use), and one 200 Gb/s NIC per GPU is assumed.
# Efficiencies, from public measurements on these parts: NCCL all-gather / reduce-scatter bus
# bandwidth ~80% of NVLink's per-direction figure (nccl-tests on HGX H100: ~360 of 450 GB/s) and
# ~85% of the NIC's (PCIe: 80% assumed alike); cuBLAS bf16 GEMMs of LLM shapes ~70% of peak on
# H100 (~75% on A100); FlashAttention-2 (torch's SDPA kernels) ~40% of peak on H100 forward and
# backward, ~55% on A100; elementwise kernels ~80% of HBM bandwidth; eager PyTorch dispatches
# an op in ~10 us of host time (Python module call, autograd, launch), DTensor adds ~40 us per
# op (sharding propagation) and FSDP2 ~150 us around each collective (its hooks and copies) on
# a server CPU (about 2.5x faster than this project's CPU machines, where they measure ~95
# and ~250-400 us: planning/step_time/local_profile.py).
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
# (GEMM, grouped GEMM, attention) efficiency by part. Ada (L40S, L40, L4) and GA10x (A10)
# take A100's: assumed, not measured on those parts.
HOPPER = (0.70, 0.55, 0.40)
HOPPER_HBM3E = (0.72, 0.57, 0.42)  # H200: the same silicon fed faster
AMPERE = (0.75, 0.60, 0.55)
BLACKWELL = (0.65, 0.50, 0.35)
# (GPUs per node, intra-node bus GB/s per rank, inter-node bus GB/s per rank)
NVLINK4 = (8, 360.0, 42.5)  # 450 GB/s per direction x 0.8; 400 Gb/s NIC x 0.85
NVLINK4_H800 = (8, 160.0, 42.5)  # export part: NVLink 400 GB/s (200 per direction)
NVLINK3 = (8, 240.0, 21.25)  # 300 per direction x 0.8; 200 Gb/s NIC x 0.85
NVLINK3_A800 = (8, 160.0, 21.25)  # export part: NVLink 400 GB/s
NVLINK5 = (8, 720.0, 42.5)  # 900 per direction x 0.8
PCIE5 = (8, 51.2, 21.25)  # 64 per direction x 0.8
PCIE4 = (8, 25.6, 21.25)  # 32 per direction x 0.8


def _gpu(name, source, names, tflops, hbm_gbps, *, memory_gb, links, efficiency, **extra):
    """One GPU entry. tflops: dense (bf16, fp32, fp8 or None: no FP8 tensor cores)."""
    bf16, fp32, fp8 = tflops
    gemm, grouped, attention = efficiency
    gpus, intra, inter = links
    return HardwareProfile(
        name,
        source,
        {"bfloat16": bf16, "float32": fp32, **({"float8": fp8} if fp8 else {})},
        hbm_gbps=hbm_gbps,
        memory_gib=memory_gb * GB / 2**30,
        gpus_per_node=gpus,
        intra_node_gbps=intra,
        inter_node_gbps=inter,
        gemm_efficiency=gemm,
        grouped_gemm_efficiency=grouped,
        attention_efficiency=attention,
        device_names=tuple(names),
        **{**_GPU_COMMON, **extra},
    )


# fmt: off
# dense (bf16, fp32, fp8) TFLOPS shared by several entries
_H100 = (989.4, 66.9, 1978.9)  # H100 whitepaper (2023), SXM5; H200, H800, GH200: same silicon
_H100_PCIE = (756.5, 51.2, 1513.0)  # H100 whitepaper, PCIe (lower clocks and power)
_NVL = (835.5, 60.0, 1670.5)  # H100 NVL and H200 NVL datasheets (1,671 / 3,341 sparse)
_A100 = (312.0, 19.5, None)  # A100 datasheet (2021), SXM4 and PCIe alike; no FP8
_GH200 = (1, 360.0, 42.5)  # one superchip per node (MGX); several: --hardware.gpus_per_node
_ALL = (
    # name, source, device names, (bf16, fp32, fp8) TFLOPS, memory GB/s, memory GB, links,
    # efficiencies
    _gpu("h100_sxm", "NVIDIA H100 SXM5 80GB datasheet; 8 per HGX node, 400 Gb/s NIC per GPU",
         ["NVIDIA H100 80GB HBM3"], _H100, 3350,
         memory_gb=80, links=NVLINK4, efficiency=HOPPER),
    _gpu("h100_pcie", "NVIDIA H100 PCIe 80GB datasheet; 8 per server over PCIe Gen5",
         ["NVIDIA H100 PCIe", "NVIDIA H100 80GB PCIe"], _H100_PCIE, 2000,
         memory_gb=80, links=PCIE5, efficiency=HOPPER),
    _gpu("h100_nvl", "NVIDIA H100 NVL 94GB datasheet; 8 per server over PCIe Gen5",
         ["NVIDIA H100 NVL"], _NVL, 3900,
         memory_gb=94, links=PCIE5, efficiency=HOPPER),
    # The hardware of torchtitan's published Llama 3.1 benchmarks (Grand Teton: H100 SXM with
    # 96 GB HBM2e at 2.4 TB/s and a 500 W power limit, 8 per host over NVLink, 400 Gb/s RDMA
    # per GPU). Same silicon and efficiencies as h100_sxm; the 500 W cap lowers the sustained
    # tensor-core clock: `clock_factor` is the one value calibrated on a published run
    # (docs/step_time.md names the run). No device name chooses it: --hardware.profile only.
    _gpu("h100_grand_teton",
         "H100 SXM 96GB HBM2e 2.4 TB/s, 500 W (torchtitan's published benchmarks' hardware)",
         [], _H100, 2400,
         memory_gb=96, links=NVLINK4, efficiency=HOPPER, clock_factor=0.832),
    _gpu("h800", "NVIDIA H800 SXM: H100 silicon, NVLink 400 GB/s; 8 per node, 400 Gb/s NIC per GPU",
         ["NVIDIA H800", "NVIDIA H800 80GB HBM3"], _H100, 3350,
         memory_gb=80, links=NVLINK4_H800, efficiency=HOPPER),
    _gpu("h800_pcie", "NVIDIA H800 PCIe 80GB: H100 PCIe silicon; 8 per server over PCIe Gen5",
         ["NVIDIA H800 PCIe"], _H100_PCIE, 2000,
         memory_gb=80, links=PCIE5, efficiency=HOPPER),
    _gpu("h200", "NVIDIA H200 SXM 141GB datasheet; 8 per HGX node, 400 Gb/s NIC per GPU",
         ["NVIDIA H200", "NVIDIA H200 141GB HBM3e"], _H100, 4800,
         memory_gb=141, links=NVLINK4, efficiency=HOPPER_HBM3E),
    _gpu("h200_nvl", "NVIDIA H200 NVL 141GB datasheet; 8 per server over PCIe Gen5",
         ["NVIDIA H200 NVL"], _NVL, 4800,
         memory_gb=141, links=PCIE5, efficiency=HOPPER_HBM3E),
    _gpu("gh200", "NVIDIA GH200 datasheet, 96 GB HBM3 (480 GB with the CPU's); one per node",
         ["NVIDIA GH200 480GB"], _H100, 4000,
         memory_gb=96, links=_GH200, efficiency=HOPPER),
    _gpu("gh200_144gb", "NVIDIA GH200 datasheet, 144 GB HBM3e; one per node",
         ["NVIDIA GH200 144G HBM3e"], _H100, 4900,
         memory_gb=144, links=_GH200, efficiency=HOPPER_HBM3E),
    _gpu("a100_80gb", "NVIDIA A100 SXM4 80GB datasheet; 8 per HGX node, 200 Gb/s NIC per GPU",
         ["NVIDIA A100-SXM4-80GB"], _A100, 2039,
         memory_gb=80, links=NVLINK3, efficiency=AMPERE),
    _gpu("a100_40gb", "NVIDIA A100 SXM4 40GB datasheet; 8 per HGX node, 200 Gb/s NIC per GPU",
         ["NVIDIA A100-SXM4-40GB"], _A100, 1555,
         memory_gb=40, links=NVLINK3, efficiency=AMPERE),
    _gpu("a100_pcie_80gb", "NVIDIA A100 PCIe 80GB datasheet; 8 per server over PCIe Gen4",
         ["NVIDIA A100 80GB PCIe"], _A100, 1935,
         memory_gb=80, links=PCIE4, efficiency=AMPERE),
    _gpu("a100_pcie_40gb", "NVIDIA A100 PCIe 40GB datasheet; 8 per server over PCIe Gen4",
         ["NVIDIA A100-PCIE-40GB"], _A100, 1555,
         memory_gb=40, links=PCIE4, efficiency=AMPERE),
    _gpu("a800", "NVIDIA A800 SXM4 80GB: A100 silicon, NVLink 400 GB/s; 8 per node, 200 Gb/s NIC",
         ["NVIDIA A800-SXM4-80GB"], _A100, 2039,
         memory_gb=80, links=NVLINK3_A800, efficiency=AMPERE),
    _gpu("a800_pcie", "NVIDIA A800 PCIe 80GB: A100 PCIe silicon; 8 per server over PCIe Gen4",
         ["NVIDIA A800 80GB PCIe"], _A100, 1935,
         memory_gb=80, links=PCIE4, efficiency=AMPERE),
    _gpu("b200", "NVIDIA HGX B200 180GB datasheet; 8 per node, 400 Gb/s NIC per GPU",
         ["NVIDIA B200"], (2250.0, 80.0, 4500.0), 8000,
         memory_gb=180, links=NVLINK5, efficiency=BLACKWELL),
    # GB200 NVL72: 72 GPUs in one NVLink domain (a "node" of the step-time model); per GPU
    # 1/72 of the rack's figures (360 PFLOPS bf16 sparse, 13.4 TB HBM3e at 576 TB/s)
    _gpu("gb200", "NVIDIA GB200 NVL72 datasheet, per GPU; 72 per NVLink domain, 400 Gb/s NIC",
         ["NVIDIA GB200"], (2500.0, 80.0, 5000.0), 8000,
         memory_gb=186, links=(72, 720.0, 42.5), efficiency=BLACKWELL),
    _gpu("l40s", "NVIDIA L40S 48GB GDDR6 datasheet; 8 per server over PCIe Gen4",
         ["NVIDIA L40S"], (362.05, 91.6, 733.0), 864,
         memory_gb=48, links=PCIE4, efficiency=AMPERE),
    _gpu("l40", "NVIDIA L40 48GB GDDR6 datasheet; 8 per server over PCIe Gen4",
         ["NVIDIA L40"], (181.05, 90.5, 362.0), 864,
         memory_gb=48, links=PCIE4, efficiency=AMPERE),
    _gpu("l4", "NVIDIA L4 24GB GDDR6 datasheet; 8 per server over PCIe Gen4",
         ["NVIDIA L4"], (121.0, 30.3, 242.5), 300,
         memory_gb=24, links=PCIE4, efficiency=AMPERE),
    _gpu("a10", "NVIDIA A10 24GB GDDR6 datasheet; 8 per server over PCIe Gen4",
         ["NVIDIA A10"], (125.0, 31.2, None), 600,
         memory_gb=24, links=PCIE4, efficiency=AMPERE),
)
# fmt: on
PROFILES: dict[str, HardwareProfile] = {p.name: p for p in _ALL}
NAMES = (*PROFILES, "local")
WITHOUT_GPU = "h100_sxm"  # auto for a GPU job where none is visible (planned on a CPU machine)

# Words of a GPU name that say nothing about which part it is (vendor, form SXM: the default).
_NOISE_WORDS = {"NVIDIA", "TESLA", "SXM", "SXM2", "SXM4", "SXM5", "HBM2", "HBM2E", "HBM3", "HBM3E"}


def name_words(device_name: str) -> frozenset[str]:
    """The words a GPU name is matched by: upper case, split at spaces, dashes, slashes and
    underscores, vendor and memory-kind words dropped ("NVIDIA A100-SXM4-80GB" -> A100, 80GB)."""
    words = re.split(r"[\s\-_/]+", device_name.upper())
    return frozenset(w for w in words if w and w not in _NOISE_WORDS)


def _by_words() -> dict[frozenset[str], str]:
    out: dict[frozenset[str], str] = {}
    for profile in _ALL:
        for device_name in profile.device_names:
            words = name_words(device_name)
            if out.setdefault(words, profile.name) != profile.name:
                raise ValueError(f"{device_name!r} names both {out[words]} and {profile.name}")
    return out


_PROFILE_OF_WORDS = _by_words()


def gpu_profile_name(device_name: str) -> str | None:
    """The profile of a GPU by its name (nvidia-smi / torch.cuda.get_device_name): the entry
    listing a name of exactly its words; None for a GPU the table does not hold (no guess:
    "NVIDIA A10G" is not the A10, "NVIDIA GB200" not the B200)."""
    return _PROFILE_OF_WORDS.get(name_words(device_name))


def unknown_gpu_line(device_name: str) -> str:
    """The one line for a GPU the table does not hold: its name and the keys that describe it."""
    named = ", ".join(PROFILES)
    return (
        f"GPU '{device_name}' is not in the hardware table (torchtitan/hardware.py): set"
        f" --hardware.profile=<one of {named}> for its step time and MFU, or"
        " --hardware.peak_tflops=<dense bf16 TFLOPS> for its MFU alone"
    )


class UnknownGPU(ValueError):
    """profile auto on a GPU job whose visible GPUs the table does not name (one line)."""


def auto_profile(gpu_names: list[str]) -> str:
    """--hardware.profile=auto for a GPU job: the profile of the visible GPUs' name; WITHOUT_GPU
    when none is visible (a dry run on a CPU machine: planned for the default part, no GPU
    guessed at); UnknownGPU for a GPU the table does not hold or GPUs of two profiles."""
    if not gpu_names:
        return WITHOUT_GPU
    found = {n: gpu_profile_name(n) for n in dict.fromkeys(gpu_names)}
    unknown = [n for n, p in found.items() if p is None]
    if unknown:
        raise UnknownGPU(unknown_gpu_line(unknown[0]))
    if len(set(found.values())) > 1:
        raise UnknownGPU(
            f"GPUs of different profiles are visible ({', '.join(found)}): set"
            " --hardware.profile=<name> for the one to plan for"
        )
    return next(iter(found.values()))


def measured_peak_tflops(device_name: str, profile: str = "auto") -> float | None:
    """The dense bf16 peak (TFLOPS) the trainer's measured MFU divides by: the figure of
    --hardware.profile, or (auto, local) of the profile the GPU's name chooses; the predicted
    MFU of a bf16 job divides by the same entry's figure. None for a GPU the table does not hold."""
    name = profile if profile in PROFILES else gpu_profile_name(device_name)
    return None if name is None else PROFILES[name].peak_tflops["bfloat16"]


# [hardware] keys that override one value of the chosen profile
OVERRIDES = (
    "gpus_per_node",
    "peak_tflops",
    "hbm_gbps",
    "intra_node_gbps",
    "inter_node_gbps",
    "gemm_efficiency",
    "clock_factor",
)


def with_overrides(profile: HardwareProfile, hw) -> HardwareProfile:
    """`profile` with every [hardware] key that is not "auto" applied (hw: config.Hardware).
    peak_tflops is bf16's: the profile's other dtypes scale by the same ratio."""
    changes = {}
    for key in OVERRIDES:
        value = getattr(hw, key, "auto")
        if value == "auto":
            continue
        if key == "peak_tflops":
            bf16 = profile.peak_tflops.get("bfloat16", 0.0)
            ratio = float(value) / bf16 if bf16 else 1.0
            value = {d: t * ratio for d, t in profile.peak_tflops.items()} | {
                "bfloat16": float(value)
            }
        changes[key] = value
    return dataclasses.replace(profile, **changes) if changes else profile


def resolve(
    hw, target: str, local=None, gpu_names: list[str] | None = None
) -> HardwareProfile | None:
    """The profile a job is predicted for ([hardware] section `hw`, its target "cpu" / "cuda"):
    `local` comes from `local()` (None: not measured, no prediction); `gpu_names`: the visible
    GPUs' names for "auto" on a GPU job (auto_profile: UnknownGPU for a GPU the table lacks)."""
    name = hw.profile
    if name == "auto":
        name = "local" if target == "cpu" else auto_profile(gpu_names or [])
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


def gpu_compute_capabilities() -> list[tuple[int, int]]:
    """(major, minor) compute capability of each GPU nvidia-smi lists; [] without one."""
    caps = []
    for line in _nvidia_smi("compute_cap") or []:
        try:
            major, minor = line.split(".")
            caps.append((int(major), int(minor)))
        except ValueError:
            return []
    return caps
