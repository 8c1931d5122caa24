"""The sections of the pre-launch planning: [planning], [hardware], [memory_estimation] (see
job_config.py for the conventions)."""

from dataclasses import dataclass
from typing import Literal

AUTO = "auto"  # derive the value from the rest of the job


@dataclass
class Planning:
    """What is decided before launch from the simulated step (planning/): the memory budget a
    job must fit, the routing skew it is planned for, and the dry run's searches (the largest
    fit, the fastest layout, the nearby choices). The machine they are predicted for is
    [hardware]."""

    memory_budget_gib: float | Literal["auto", "none"] = AUTO
    """Most GiB of tensor memory one rank may use at its peak (the dry run's prediction:
    parameters, gradients, optimizer states, gathered parameters, activations, buffers).
    auto: the device's memory (CUDA: minus a margin; CPU: the available memory shared by the
    ranks of this node, less what a process needs beyond its tensors; planning/memory/budget.py).
    none: no budget. Jobs over it are refused (see allow_over_budget)."""

    memory_skew: float = 1.0
    """Routing skew the memory prediction plans for: the busiest expert-parallel rank receives
    memory_skew times its balanced share of token copies (1 = balanced; the EP degree = every
    token to one rank, the worst case, always reported beside the planned figure)."""

    fit: Literal["", "local_batch_size", "seq_len", "layout"] = ""
    """With dry_run: search the largest training.local_batch_size (or seq_len) whose predicted
    peak fits planning.memory_budget_gib, per activation-checkpoint mode (gradient
    accumulation steps held fixed, so the global batch grows with the local batch).
    layout: search the fastest layout for NGPU devices on the hardware profile (degrees,
    pipeline schedule and microbatch, AC mode, reshard policy, local batch under the job's
    global batch): every feasible layout scored by the step-time model composed from a probe
    of the model's block, the best confirmed by full simulations (planning/search/search.py);
    prints the certificate and the top layouts with their overrides and writes the pick to
    <dump_folder>/best_layout.toml."""

    layout_candidates: int = 5
    """With fit = layout: how many of the best-scored layouts the checks accept are simulated
    in full (each about one dry run of the job; the pick is the first of them whose full
    prediction fits the budget, and their errors set the certificate's band). More confirms
    more, slower."""

    layout_seconds: float = 420.0
    """With fit = layout: no full simulation starts after this many seconds of them; the
    search then picks among those done."""

    layout_float8: Literal["keep", "choose"] = "keep"
    """With fit = layout: keep the job's precision (model.converters as configured), or
    choose: every layout also scored with float8 linears on and off (quantize.linear.float8,
    its [quantize.linear.float8] keys as configured; float8 changes the numerics, the
    convergence in docs/float8.md), the pick's overrides then set model.converters. Needs a
    profile with float8 tensor cores (SM89 or later)."""

    nearby: bool = True
    """With dry_run and a hardware profile: also predict the choices next to the job (the AC
    modes on either side, reshard never / always, one microbatch more or fewer, compile
    switched) and print what each would gain in step time and cost in memory; one more
    simulation per choice (false skips them). Nothing about the job's own plan changes."""

    allow_over_budget: bool = False
    """Train even when a rank role's predicted peak exceeds memory_budget_gib
    (by default the job stops before the first step and prints changes that would fit)."""


@dataclass
class Hardware:
    """The machine a job is predicted for and measured on (torchtitan/hardware.py, the one GPU
    table; planning/step_time/model.py): a named profile, single values of which the keys
    below override."""

    profile: Literal[
        "auto",
        "local",
        "h100_sxm",
        "h100_pcie",
        "h100_nvl",
        "h100_grand_teton",
        "h800",
        "h800_pcie",
        "h200",
        "h200_nvl",
        "gh200",
        "gh200_144gb",
        "a100_80gb",
        "a100_40gb",
        "a100_pcie_80gb",
        "a100_pcie_40gb",
        "a800",
        "a800_pcie",
        "b200",
        "gb200",
        "l40s",
        "l40",
        "l4",
        "a10",
    ] = AUTO
    """auto: `local` for a CPU job; for a GPU job the profile the visible GPUs' exact name
    chooses (nvidia-smi; the names each profile lists in torchtitan/hardware.py, never a guess:
    a GPU it does not list gets no step-time prediction and one line naming it and this key);
    h100_sxm when no GPU is visible (a dry run of a GPU job on a CPU machine: a default part,
    not a guess about a GPU that is there). `local` is this machine as a short micro-benchmark
    finds it (GEMM, memory-bound ops, attention, op overhead, gloo collectives), cached in
    ~/.cache/torchtitan by the first dry run; the named profiles are the entries of the one
    hardware table (torchtitan/hardware.py: datasheet figures with their sources), which both
    the predicted and the measured MFU read."""

    gpus_per_node: int | Literal["auto"] = AUTO
    """Ranks per node sharing the fast intra-node links (NVLink; PCIe cards: the server's PCIe);
    auto = the profile's (8 for most GPU profiles, 1 for gh200, 72 for gb200's NVLink domain)."""

    peak_tflops: float | Literal["auto"] = AUTO
    """Dense bf16 peak TFLOPS of one device, the one figure both the predicted and the
    measured MFU divide by (the profile's other dtypes, fp32's for fp32 jobs, scaled alike);
    auto = the profile's datasheet figure: that of `profile`, or (auto) of the GPU's name (a GPU
    the table does not hold: no MFU; none on CPU: no measured MFU)."""

    hbm_gbps: float | Literal["auto"] = AUTO
    """Device memory bandwidth in GB/s; auto = the profile's."""

    intra_node_gbps: float | Literal["auto"] = AUTO
    """Achievable collective bus bandwidth per rank inside a node, GB/s; auto = the profile's."""

    inter_node_gbps: float | Literal["auto"] = AUTO
    """Achievable collective bus bandwidth per rank across nodes (its NIC), GB/s; auto = the profile's."""

    gemm_efficiency: float | Literal["auto"] = AUTO
    """Fraction of peak FLOPS a large GEMM reaches; auto = the profile's."""

    clock_factor: float | Literal["auto"] = AUTO
    """Sustained fraction of the boost clock the compute units hold (a power cap lowers it),
    scaling every peak FLOPS figure; auto = the profile's (1, or h100_grand_teton's calibrated
    value: docs/step_time.md)."""


@dataclass
class MemoryEstimation:
    """Upstream's memory estimation before training ([memory_estimation])."""

    enable: bool = False
    """Print every rank role's predicted peak memory before launch (this fork's prediction,
    the one planning.memory_budget_gib checks), then train."""

    disable_fake_mode: bool = False
    """Upstream estimated on real tensors with it; the prediction here never allocates:
    accepted, no effect."""
