"""The `local` hardware profile: this machine, measured by a short micro-benchmark and cached.

    python -m torchtitan.planning.step_time.local_profile          # measure (about a minute) and cache
    python -m torchtitan.planning.step_time.local_profile --show   # print the cached profile

What a CPU training rank runs on: one thread per rank when several ranks share the machine
(torchrun's default), gloo collectives between processes on the same machine. Measured:

- GEMM (float32 and bfloat16, one thread): time of square and LLM-shaped matmuls against their FLOPs; a
  line t = flops / peak + fixed gives the peak and the size at half efficiency
  (fixed x peak), which is the profile's GEMM curve (hardware.py);
- memory-bound ops (one thread): a block's elementwise ops and reductions on activation-sized
  tensors, bytes read and written per second; and the same on tensors beyond the last-level
  cache (an op moving more than the cache holds, such as the optimizer's, streams from DRAM);
- attention (SDPA forward + backward): efficiency against the GEMM peak by head dim, and the
  block a causal mask lets the kernel skip;
- host time per op: a chain of small ops with autograd, forward and backward, divided by
  the ops the dispatcher saw (Python, autograd, dispatch: what dominates tiny models); what
  DTensor adds per op on DTensors, and what each FSDP2 hook costs (the framework's own
  blocks fully_shard-ed against plain ones, on a 1-process gloo group, over the hooks run);
- on the calibration row, the debug Llama3's forward, loss and backward (cpu_bench.py): the
  rate its memory-bound ops reach, each timed where it runs (activations read long after
  they were written, outputs freshly allocated: a step's ops run 2-3x slower than the
  micro-benchmark above, which re-reads warm tensors; step_memory_gbps, every memory-bound
  op's rate); the thread speedup on every core vs one thread (a job with fewer ranks than cores gives each
  rank more threads: run_train.sh), the slowdown when 2 and when 4 single-threaded processes
  run it at once (shared caches and memory bandwidth, time slices beyond the cores), and the
  profile's one fitted constant, time_factor: its step on one thread measured over predicted
  from the figures above;
- gloo (with the framework's host costs: cpu_workers.py, processes of their own): all-gather, reduce-scatter, all-reduce, all-to-all and send/recv among 2 and among 4
  processes at 4 KiB and 4 MiB, each between ~2 ms of GEMMs on every process (as a step
  interleaves them: waiting for the others and sharing the cores count): a fixed cost per
  collective kind and the bandwidth, per process count; and, where the processes have a core
  each, the skew: how much longer a collective waits per second the ranks computed since the
  last one (they drift apart; the first to arrive waits for the last).

Grouped GEMM on CPU is a loop of GEMMs: it uses the GEMM curve at a mid-size GEMM.
The cache key is the CPU model, the core count and the torch version (a new machine or
torch measures again): ~/.cache/torchtitan/local_profile.json (TITAN_PROFILE_CACHE overrides;
"none": no local profile, nothing measured: the tests' setting).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import platform
import socket
import sys
import time

import torch

from torchtitan import log
from torchtitan.hardware import HardwareProfile, UnknownGPU, gpu_names, resolve
from torchtitan.planning.step_time.cpu_bench import (
    calibration_seconds,
    measure_sharing,
    step_memory_rate,
    thread_speedup,
    timed,
)
from torchtitan.planning.step_time.cpu_workers import measure_framework, measure_gloo
from torchtitan.planning.step_time.trace import causal_kept

# by name: this module also runs as __main__ (python -m ...local_profile)
logger = logging.getLogger("torchtitan.planning.step_time.local_profile")

# (m, k, n, layout): a training step's GEMMs: activations x weight^T (forward), gradient x
# weight (input gradient), gradient^T x activations (weight gradient)
_GEMM_SHAPES = (
    (1024, 256, 256, "nt"),
    (1024, 256, 768, "nt"),
    (1024, 768, 256, "nn"),
    (256, 1024, 256, "tn"),
    (1024, 256, 2048, "nt"),
    (2048, 512, 512, "nt"),
    (512, 2048, 512, "tn"),
    (1024, 1024, 1024, "nn"),
    (4096, 256, 1024, "nt"),
    (128, 128, 128, "nn"),
)
_HEAD_DIMS = (16, 32, 64, 128)
# 2: medians (not the best of N), FSDP2's host time per hook, DRAM; 3: DRAM in place;
# 4: the thread speedup, the sharing and gloo's loops from REPEATS measurements each;
# 5: time_factor fitted on the debug Llama3's forward + backward (calibration_seconds)
# 6: step_memory_gbps, the memory-bound ops' rate measured inside the calibration step
# 7: the gloo table's skew (cpu_workers._sync_skew)
PROFILE_VERSION = 7


def cache_path() -> str:
    return os.environ.get("TITAN_PROFILE_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "torchtitan", "local_profile.json"
    )


def machine_key() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(
                (line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu
            )
    except OSError:
        pass
    # the profile's version: a cache measured by an earlier micro-benchmark is measured again
    return f"{cpu} | {os.cpu_count()} cpus | torch {torch.__version__} | profile {PROFILE_VERSION}"


def measure_gemm(dtype=torch.float32) -> tuple[float, float]:
    """(peak FLOP/s, GFLOP at half efficiency), one thread."""
    flops, secs = [], []
    for m, k, n, layout in _GEMM_SHAPES:
        a = (
            torch.randn(k, m, dtype=dtype).t()
            if layout[0] == "t"
            else torch.randn(m, k, dtype=dtype)
        )
        b = (
            torch.randn(n, k, dtype=dtype).t()
            if layout[1] == "t"
            else torch.randn(k, n, dtype=dtype)
        )
        reps = max(1, int(2e8 // (2 * m * k * n)))

        def run(a=a, b=b, reps=reps):
            for _ in range(reps):
                torch.mm(a, b)

        secs.append(timed(run) / reps)
        flops.append(2.0 * m * k * n)
    # the peak: the median rate of the LLM-shaped GEMMs; the half-efficiency size from the
    # smallest one (a line fit's intercept is noise at these sizes)
    rates = sorted(f / t for f, t in zip(flops, secs))
    peak = rates[len(rates) // 2]
    small = min(range(len(flops)), key=lambda i: flops[i])
    eff = min(1.0, flops[small] / secs[small] / peak)
    return peak, flops[small] * (1 / eff - 1) / 1e9


def measure_memory() -> float:
    """GB/s (bytes read + written) of the memory-bound ops of a block at activation size (1 MiB
    tensors, one thread): add, mul, silu, pow, a row sum and a copy, their total bytes over
    their total time (transcendental ops are compute-bound on a CPU: they count in)."""
    x, y = torch.randn(1024, 256), torch.randn(1024, 256)
    ops = [
        (lambda: x + y, 3),
        (lambda: x * y, 3),
        (lambda: torch.nn.functional.silu(x), 2),
        (lambda: x.pow(2), 2),
        (lambda: x.sum(-1), 1),
        (lambda: x.clone(), 2),
    ]
    total_s = sum(timed(fn, 20) for fn, _ in ops)
    return sum(n for _, n in ops) * x.numel() * 4 / total_s / 1e9


def cache_bytes() -> int:
    """The last-level cache (sysfs; 32 MiB where it does not say): an op moving more bytes
    than this streams them from DRAM."""
    best = 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for index in os.listdir(base):
            with open(os.path.join(base, index, "size")) as f:
                text = f.read().strip()
            unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            best = max(best, int(text.rstrip("KMG")) * unit)
    except (OSError, ValueError):
        pass
    return best or 32 << 20


def measure_dram(limit: int) -> float:
    """GB/s of elementwise ops on tensors four times the last-level cache (one thread): what an
    op touching cold data gets, such as the optimizer over every parameter's states. In place:
    an op allocating a fresh output this large pays the kernel's first-touch page faults
    (measured: 6.2-6.4 GB/s that way), which the optimizer's in-place ops and the allocator's
    reused blocks do not."""
    n = max(1 << 20, 4 * limit // 4)  # float32 elements: 4 x the cache per tensor
    x, y = torch.randn(n), torch.randn(n)
    ops = [(lambda: x.add_(y), 3), (lambda: x.mul_(0.5), 2), (lambda: x.copy_(y), 2)]
    total_s = sum(timed(fn, 3) for fn, _ in ops)
    return sum(k for _, k in ops) * n * 4 / total_s / 1e9


def measure_attention(peak: float) -> tuple[dict[int, float], int]:
    """(efficiency of SDPA forward + backward by head dim, the causal kernel's skipped block):
    fraction of the GEMM peak at sequence 256 without a mask; the block from how much a
    causal mask saves at sequence 1024 (kept fraction = causal / full time)."""
    import torch.nn.functional as F

    def sdpa_s(q, causal: bool) -> float:
        k, v = torch.randn_like(q).requires_grad_(), torch.randn_like(q).requires_grad_()

        def run():
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            torch.autograd.grad(out, (q, k, v), torch.ones_like(out))

        return timed(run, 3)

    eff = {}
    for d in _HEAD_DIMS:
        q = torch.randn(2, max(1, 512 // d), 256, d, requires_grad=True)
        b, h, s, _ = q.shape
        flops = (
            2.0 * b * h * s * s * (2 * d + 5 * d)
        )  # forward + backward (op_trace.attention_flops)
        eff[d] = min(1.0, flops / sdpa_s(q, False) / peak)
    q = torch.randn(1, 4, 1024, 64, requires_grad=True)
    kept = sdpa_s(q, True) / sdpa_s(q, False)
    block = min((64, 128, 256, 512, 1024), key=lambda blk: abs(causal_kept(1024, 1024, blk) - kept))
    return eff, block


def measure_host_per_op() -> tuple[float, float, float]:
    """Microseconds of host time per dispatched op: the framework's own Llama3 blocks at a
    size where the kernels take next to nothing (flavor tiny, 4 x 16 tokens), forward and
    backward, over the ops the dispatcher saw (Python module calls, autograd, dispatch);
    then what activation checkpointing adds per op of a checkpointed block (its forward and
    its recomputation), with every block checkpointed whole and with an op-level policy."""
    from torch.utils.checkpoint import (
        CheckpointPolicy,
        checkpoint,
        create_selective_checkpoint_contexts,
    )

    from torchtitan.config.manager import build_config
    from torchtitan.training.planned_job import model_on_meta

    cfg, _ = build_config(["--model.name=llama3", "--model.flavor=tiny", "--training.seq_len=16"])
    model = model_on_meta(cfg).model
    model.to_empty(device="cpu")
    model.init_weights(0, torch.device("cpu"))
    tokens = torch.randint(0, 100, (4, 16))

    def step():
        model(tokens).float().sum().backward()

    plain_us, plain_ops = _ops_per_second(step)
    blocks = list(model.layers.values())
    originals = [b.forward for b in blocks]

    def save_matmuls(ctx, func, *args, **kwargs):
        return (
            CheckpointPolicy.MUST_SAVE
            if func in (torch.ops.aten.mm.default,)
            else CheckpointPolicy.PREFER_RECOMPUTE
        )

    def wrapped(policy):
        for b, fwd in zip(blocks, originals):
            if policy is None:
                b.forward = lambda *a, f=fwd, **k: checkpoint(f, *a, use_reentrant=False, **k)
            else:
                b.forward = lambda *a, f=fwd, **k: checkpoint(
                    f,
                    *a,
                    use_reentrant=False,
                    context_fn=lambda: create_selective_checkpoint_contexts(policy),
                    **k,
                )

    extra = []
    for policy in (None, save_matmuls):
        wrapped(policy)
        us, ops = _ops_per_second(step)
        # the ops of the checkpointed blocks: everything beyond the plain step's ops ran again
        region_ops = max(ops - plain_ops, 1) * 2
        extra.append(
            max(0.0, us * ops - plain_us * plain_ops - (ops - plain_ops) * plain_us) / region_ops
        )
    for b, fwd in zip(blocks, originals):
        b.forward = fwd
    return plain_us, extra[0], extra[1]


def _ops_per_second(step) -> tuple[float, int]:
    """(microseconds of wall time per dispatched op of `step`, the ops)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        step()
    ops = Count.n
    return timed(step) / ops * 1e6, ops


def measure() -> HardwareProfile:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        peak, half = measure_gemm()
        peak_bf16, _ = measure_gemm(torch.bfloat16)
        memory = measure_memory()
        llc = cache_bytes()
        dram = measure_dram(llc)
        host, ac_us, sac_us = measure_host_per_op()
        attention, block = measure_attention(peak)
    finally:
        torch.set_num_threads(threads)
    cores = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )
    speedup = thread_speedup(cores)
    sharing = measure_sharing(cores)
    framework = measure_framework()
    gloo = {str(n): measure_gloo(n, drift=n <= cores) for n in (2, 4)}
    # attention and grouped GEMM: the GEMM curve's efficiency at a mid-size GEMM (1 GFLOP)
    mid = 1.0 / (1.0 + half)
    profile = HardwareProfile(
        "local",
        f"measured on {socket.gethostname()} ({machine_key()}), {time.strftime('%Y-%m-%d %H:%M')}",
        {"bfloat16": peak_bf16 / 1e12, "float32": peak / 1e12},
        hbm_gbps=memory,
        memory_gib=0.0,
        gpus_per_node=1 << 20,
        intra_node_gbps=gloo["2"]["gbps"],
        inter_node_gbps=gloo["2"]["gbps"],
        intra_latency_us=0.0,
        inter_latency_us=0.0,
        gemm_efficiency=1.0,
        gemm_half_gflop=half,
        grouped_gemm_efficiency=mid,
        attention_efficiency=attention[64],
        attention_block=block,
        memory_efficiency=1.0,
        host_us_per_op=host,
        dtensor_us_per_op=framework["dtensor_us_per_op"],
        # FSDP2's host time is charged per hook (host_us_per_fsdp_hook); gloo's own per call
        # is in the fixed cost per collective kind (collective_us)
        host_us_per_collective=0.0,
        dram_gbps=dram,
        cache_bytes=llc,
        host_us_per_fsdp_hook=framework["host_us_per_fsdp_hook"],
        thread_speedup=speedup,
        sharing=sharing,
        ac_us_per_op=ac_us,
        sac_us_per_op=sac_us,
        compiled_memory_fraction=1.0,
        compiled_ops_per_kernel=1.0,
        host_async=False,
        cores=cores,
        collective_us=gloo["2"]["fixed_us"],
        attention_by_head_dim=attention,
        gloo=gloo,
    )
    # the memory-bound ops' rate inside a step, measured on the calibration row; then the one
    # fitted constant (docs/step_time.md): what the figures above still miss of that row
    profile = dataclasses.replace(profile, step_memory_gbps=step_memory_rate(profile))
    measured, predicted = calibration_seconds(profile)
    return dataclasses.replace(profile, time_factor=measured / predicted)


def load(measure_if_missing: bool = True) -> HardwareProfile | None:
    """The cached profile of this machine (measured now when missing and allowed)."""
    path = cache_path()
    if path == "none":
        return None
    try:
        with open(path) as f:
            cached = json.load(f)
        if cached.get("key") == machine_key():
            return HardwareProfile(**cached["profile"])
    except (OSError, ValueError, TypeError, KeyError):
        pass
    if not measure_if_missing:
        return None
    profile = measure()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump({"key": machine_key(), "profile": dataclasses.asdict(profile)}, f, indent=1)
    os.replace(path + ".tmp", path)
    return profile


def job_hardware(cfg, target: str, measure: bool) -> HardwareProfile | None:
    """The job's profile ([hardware], hardware.resolve); `local` is measured now when not cached
    and `measure` (the dry run), else None: no step-time prediction (the trainer does not
    benchmark while its ranks start). A visible GPU the table does not hold (profile auto):
    None, no step-time prediction; the dry run prints the one line naming it and the keys (the
    trainer says it in its MFU line, once, not from every rank here)."""
    try:
        return resolve(
            cfg.hardware,
            target,
            lambda: load(measure_if_missing=measure),
            gpu_names() if target == "cuda" else [],
        )
    except UnknownGPU as unknown:
        if measure:
            logger.warning(f"[dry run] no step-time prediction: {unknown}")
        return None


def main(argv: list[str]) -> int:
    log.setup()
    if "--show" in argv:
        profile = load(measure_if_missing=False)
        logger.info(
            json.dumps(dataclasses.asdict(profile), indent=1)
            if profile
            else f"no profile cached at {cache_path()}"
        )
        return 0
    if os.path.exists(cache_path()):
        os.remove(cache_path())
    t0 = time.perf_counter()
    profile = load()
    logger.info(json.dumps(dataclasses.asdict(profile), indent=1))
    logger.info(f"measured in {time.perf_counter() - t0:.1f}s, cached at {cache_path()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
