"""The `local` hardware profile: this machine, measured by a short micro-benchmark and cached.

    python -m torchtitan.memory.local_profile          # measure (about a minute) and cache
    python -m torchtitan.memory.local_profile --show   # print the cached profile

What a CPU training rank runs on: one thread per rank when several ranks share the machine
(torchrun's default), gloo collectives between processes on the same machine. Measured:

- GEMM (float32, one thread): time of square and LLM-shaped matmuls against their FLOPs; a
  line t = flops / peak + fixed gives the peak and the size at half efficiency
  (fixed x peak), which is the profile's GEMM curve (hardware.py);
- memory-bound ops (one thread): a block's elementwise ops and reductions on activation-sized
  tensors, bytes read and written per second;
- attention (SDPA forward + backward): efficiency against the GEMM peak by head dim, and the
  block a causal mask lets the kernel skip;
- host time per op: a chain of small ops with autograd, forward and backward, divided by
  the ops the dispatcher saw (Python, autograd, dispatch: what dominates tiny models);
- gloo: all-gather, reduce-scatter, all-reduce, all-to-all and send/recv between 2 processes
  at 4 KiB and 4 MiB: a fixed cost per collective kind and the bandwidth.

Grouped GEMM on CPU is a loop of GEMMs: it uses the GEMM curve at a mid-size GEMM.
The cache key is the CPU model, the core count and the torch version (a new machine or
torch measures again): ~/.cache/torchtitan/local_profile.json (TITAN_PROFILE_CACHE overrides;
"none": no local profile, nothing measured: the tests' setting).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import socket
import sys
import tempfile
import time

import torch

from torchtitan.memory.hardware import HardwareProfile, resolve
from torchtitan.memory.op_trace import causal_kept

# (m, k, n, layout): a training step's GEMMs: activations x weight^T (forward), gradient x
# weight (input gradient), gradient^T x activations (weight gradient)
_GEMM_SHAPES = ((1024, 256, 256, "nt"), (1024, 256, 768, "nt"), (1024, 768, 256, "nn"), (256, 1024, 256, "tn"),
                (1024, 256, 2048, "nt"), (2048, 512, 512, "nt"), (512, 2048, 512, "tn"), (1024, 1024, 1024, "nn"),
                (4096, 256, 1024, "nt"), (128, 128, 128, "nn"))
_HEAD_DIMS = (16, 32, 64, 128)


def cache_path() -> str:
    return os.environ.get("TITAN_PROFILE_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "torchtitan", "local_profile.json")


def machine_key() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return f"{cpu} | {os.cpu_count()} cpus | torch {torch.__version__}"


def _best(fn, repeat: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares y = a x + b."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    a = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return a, my - a * mx


def measure_gemm() -> tuple[float, float]:
    """(peak FLOP/s, GFLOP at half efficiency), one thread, float32."""
    flops, secs = [], []
    for m, k, n, layout in _GEMM_SHAPES:
        a = torch.randn(k, m).t() if layout[0] == "t" else torch.randn(m, k)
        b = torch.randn(n, k).t() if layout[1] == "t" else torch.randn(k, n)
        reps = max(1, int(2e8 // (2 * m * k * n)))

        def run(a=a, b=b, reps=reps):
            for _ in range(reps):
                torch.mm(a, b)

        secs.append(_best(run) / reps)
        flops.append(2.0 * m * k * n)
    slope, fixed = _line(flops, secs)
    peak = 1.0 / slope
    return peak, max(fixed, 0.0) * peak / 1e9


def measure_memory() -> float:
    """GB/s (bytes read + written) of the memory-bound ops of a block at activation size (1 MiB
    tensors, one thread): add, mul, silu, pow, a row sum and a copy, their total bytes over
    their total time (transcendental ops are compute-bound on a CPU: they count in)."""
    x, y = torch.randn(1024, 256), torch.randn(1024, 256)
    ops = [(lambda: x + y, 3), (lambda: x * y, 3), (lambda: torch.nn.functional.silu(x), 2), (lambda: x.pow(2), 2),
           (lambda: x.sum(-1), 1), (lambda: x.clone(), 2)]
    total_s = sum(_best(fn, 20) for fn, _ in ops)
    return sum(n for _, n in ops) * x.numel() * 4 / total_s / 1e9


def measure_attention(peak: float) -> tuple[dict[int, float], int]:
    """(efficiency of SDPA forward + backward by head dim, the causal kernel's skipped block):
    fraction of the GEMM peak at sequence 256 without a mask; the block from how much a
    causal mask saves at sequence 1024 (kept fraction = causal / full time)."""
    import torch.nn.functional as F

    def timed(q, causal: bool) -> float:
        k, v = torch.randn_like(q).requires_grad_(), torch.randn_like(q).requires_grad_()

        def run():
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            torch.autograd.grad(out, (q, k, v), torch.ones_like(out))

        return _best(run, 3)

    eff = {}
    for d in _HEAD_DIMS:
        q = torch.randn(2, max(1, 512 // d), 256, d, requires_grad=True)
        b, h, s, _ = q.shape
        flops = 2.0 * b * h * s * s * (2 * d + 5 * d)  # forward + backward (op_trace.attention_flops)
        eff[d] = min(1.0, flops / timed(q, False) / peak)
    q = torch.randn(1, 4, 1024, 64, requires_grad=True)
    kept = timed(q, True) / timed(q, False)
    block = min((64, 128, 256, 512, 1024), key=lambda blk: abs(causal_kept(1024, 1024, blk) - kept))
    return eff, block


def measure_host_per_op() -> float:
    """Microseconds of host time per dispatched op (forward and backward with autograd)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    w = torch.randn(8, 8, requires_grad=True)

    def chain():
        x = torch.randn(4, 8)
        for _ in range(50):
            x = torch.nn.functional.silu(x @ w) * 0.5 + x
        x.sum().backward()

    with Count():
        chain()
    ops = Count.n
    return _best(chain) / ops * 1e6


def _gloo_worker(rank: int, world: int, path: str, out_path: str) -> None:
    import warnings

    import torch.distributed as dist

    warnings.filterwarnings("ignore", category=FutureWarning)  # the c10d names we call are deprecated aliases
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=world)
    results = {}
    for size in (1 << 10, 1 << 20):  # float32 elements: 4 KiB, 4 MiB
        x = torch.randn(size)
        out = torch.empty(size * world)
        shard = torch.empty(size // world)
        a2a = torch.empty(size)
        ops = {
            "all_gather": lambda: dist.all_gather_into_tensor(out, x),
            "reduce_scatter": lambda: dist.reduce_scatter_tensor(shard, x),
            "all_reduce": lambda: dist.all_reduce(x),
            "all_to_all": lambda: dist.all_to_all_single(a2a, x),
            "send": lambda: dist.send(x, 1) if rank == 0 else dist.recv(x, 0),
        }
        for kind, fn in ops.items():
            dist.barrier()
            fn()
            best = float("inf")
            for _ in range(5):
                dist.barrier()
                t0 = time.perf_counter()
                fn()
                best = min(best, time.perf_counter() - t0)
            # bytes as step_time counts them: gathered output, reduced input, the tensor otherwise
            nbytes = x.numel() * 4 * (world if kind == "all_gather" else 1)
            results.setdefault(kind, []).append((nbytes, best))
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


def measure_gloo() -> tuple[dict[str, float], float]:
    """(fixed microseconds per collective kind, GB/s) between 2 processes on this machine."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "gloo.json")
        mp.spawn(_gloo_worker, args=(2, os.path.join(tmp, "store"), out), nprocs=2, join=True)
        with open(out) as f:
            results = json.load(f)
    fixed, rates = {}, []
    for kind, points in results.items():
        (b0, t0), (b1, t1) = sorted(points)
        factor = 0.5 if kind in ("all_gather", "reduce_scatter", "all_to_all") else 2 * 0.5 if kind == "all_reduce" else 1.0
        rate = factor * (b1 - b0) / max(t1 - t0, 1e-9)  # step_time's formula, n = 2
        rates.append(rate)
        fixed[kind] = max(0.0, (t0 - factor * b0 / rate)) * 1e6
    fixed["recv"] = fixed.get("send", 0.0)
    rates.sort()
    return fixed, rates[len(rates) // 2] / 1e9


def measure() -> HardwareProfile:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        peak, half = measure_gemm()
        memory = measure_memory()
        host = measure_host_per_op()
        attention, block = measure_attention(peak)
    finally:
        torch.set_num_threads(threads)
    fixed, gbps = measure_gloo()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    # attention and grouped GEMM: the GEMM curve's efficiency at a mid-size GEMM (1 GFLOP)
    mid = 1.0 / (1.0 + half)
    return HardwareProfile(
        "local", f"measured on {socket.gethostname()} ({machine_key()}), {time.strftime('%Y-%m-%d %H:%M')}",
        {"bfloat16": peak / 1e12, "float32": peak / 1e12}, hbm_gbps=memory, memory_gib=0.0,
        gpus_per_node=1 << 20, intra_node_gbps=gbps, inter_node_gbps=gbps, intra_latency_us=0.0,
        inter_latency_us=0.0, gemm_efficiency=1.0, gemm_half_gflop=half, grouped_gemm_efficiency=mid,
        attention_efficiency=attention[64], attention_block=block, memory_efficiency=1.0, host_us_per_op=host,
        compiled_memory_fraction=1.0, compiled_ops_per_kernel=1.0, host_async=False, cores=cores,
        collective_us=fixed, attention_by_head_dim=attention)


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
    benchmark while its ranks start)."""
    from torchtitan.memory.budget import gpu_names

    return resolve(cfg.hardware, target, lambda: load(measure_if_missing=measure),
                   gpu_names() if target == "cuda" else [])


def main(argv: list[str]) -> int:
    if "--show" in argv:
        profile = load(measure_if_missing=False)
        print(json.dumps(dataclasses.asdict(profile), indent=1) if profile else f"no profile cached at {cache_path()}")
        return 0
    if os.path.exists(cache_path()):
        os.remove(cache_path())
    t0 = time.perf_counter()
    profile = load()
    print(json.dumps(dataclasses.asdict(profile), indent=1))
    print(f"measured in {time.perf_counter() - t0:.1f}s, cached at {cache_path()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
