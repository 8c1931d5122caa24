"""The CPU profile's measurements that take processes of their own (local_profile.py): the
framework's host costs (DTensor per op, FSDP2 per hook) in a 1-process gloo group, and gloo's
collectives among 2 and 4 processes interleaved with computation."""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time

import torch

from torchtitan.planning.step_time.cpu_bench import REPEATS, timed


def _framework_worker(path: str, out_path: str) -> None:
    """One gloo process: DTensor's host time per op, and the host time of one FSDP2 hook
    (its Python and per-parameter bookkeeping), against plain modules."""
    import warnings

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.utils._python_dispatch import TorchDispatchMode

    from torchtitan.observe.comm_stats import collective_kind

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1)
    mesh = init_device_mesh("cpu", (1,))
    x, w = torch.randn(8, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)
    dx = distribute_tensor(x.detach(), mesh, [Shard(0)]).requires_grad_()
    dw = distribute_tensor(w.detach(), mesh, [Replicate()]).requires_grad_()

    def chain(a, b):
        for _ in range(25):
            a = torch.nn.functional.silu(a @ b) * 0.5 + a
        a.sum().backward()

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.dtensor = self.collectives = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            from torch.distributed.tensor import DTensor

            if any(issubclass(t, DTensor) for t in types):
                self.dtensor += 1
                return NotImplemented
            self.collectives += collective_kind(func, args) is not None
            return func(*args, **(kwargs or {}))

    counter = Count()
    with counter:
        chain(dx, dw)
    dtensor_us = (timed(lambda: chain(dx, dw)) - timed(lambda: chain(x, w))) / counter.dtensor * 1e6

    # FSDP2's hooks, on the framework's own Llama3 blocks (flavor tiny: the kernels take next
    # to nothing), every block and the root fully_shard-ed on the 1-process mesh against the
    # same model plain: the host time per hook the trace charges (trace._FSDP_HOOKS)
    from torchtitan.config.manager import build_config
    from torchtitan.planning.step_time.trace import _FSDP_HOOKS
    from torchtitan.training.planned_job import model_on_meta

    cfg, _ = build_config(["--model.name=llama3", "--model.flavor=tiny", "--training.seq_len=16"])

    def llama(shard: bool) -> torch.nn.Module:
        model = model_on_meta(cfg).model
        model.to_empty(device="cpu")
        model.init_weights(0, torch.device("cpu"))
        if shard:
            for block in model.layers.values():
                fully_shard(block, mesh=mesh)
            fully_shard(model, mesh=mesh)
        return model

    tokens = torch.randint(0, 100, (4, 16))
    plain, sharded = llama(False), llama(True)

    class Hooks(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func._overloadpacket._qualified_op_name
            if name.startswith("profiler::") and args and str(args[0]).startswith(_FSDP_HOOKS):
                Hooks.n += 1
            return func(*args, **(kwargs or {}))

    with Hooks():
        sharded(tokens).float().sum().backward()
    hook_us = (
        timed(lambda: sharded(tokens).float().sum().backward())
        - timed(lambda: plain(tokens).float().sum().backward())
    ) / max(Hooks.n, 1)
    with open(out_path, "w") as f:
        json.dump(
            {"dtensor_us_per_op": dtensor_us, "host_us_per_fsdp_hook": max(0.0, hook_us * 1e6)}, f
        )
    dist.destroy_process_group()


def measure_framework() -> dict:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "framework.json")
        ctx = mp.get_context("spawn")
        proc = ctx.Process(target=_framework_worker, args=(os.path.join(tmp, "store"), out))
        proc.start()
        proc.join()
        with open(out) as f:
            return json.load(f)


def _gloo_worker(rank: int, world: int, path: str, out_path: str, drift: bool) -> None:
    import warnings

    import torch.distributed as dist

    warnings.filterwarnings(
        "ignore", category=FutureWarning
    )  # the c10d names we call are deprecated aliases
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=world)
    a, b = torch.randn(256, 256), torch.randn(256, 256)

    def compute():  # ~2 ms of GEMM between collectives, as a training step interleaves them
        for _ in range(6):
            torch.mm(a, b)

    def loop(fn=None, n: int = 8) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(n):
            compute()
            if fn is not None:
                fn()
        dist.barrier()
        return time.perf_counter() - t0

    results = {}
    for size in (1 << 10, 1 << 20):  # float32 elements: 4 KiB, 4 MiB
        x = torch.randn(size)
        out = torch.empty(size * world)
        shard = torch.empty(size // world)
        a2a = torch.empty(size)
        peer = rank ^ 1
        ops = {  # each bound to this size's tensors
            "all_gather": lambda out=out, x=x: dist.all_gather_into_tensor(out, x),
            "reduce_scatter": lambda shard=shard, x=x: dist.reduce_scatter_tensor(shard, x),
            "all_reduce": lambda x=x: dist.all_reduce(x),
            "all_to_all": lambda a2a=a2a, x=x: dist.all_to_all_single(a2a, x),
            "send": lambda x=x, peer=peer: (
                dist.send(x, peer) if rank % 2 == 0 else dist.recv(x, peer)
            ),
        }
        for kind, fn in ops.items():
            loop(fn, 2)
            alone = statistics.median(loop() for _ in range(REPEATS))
            with_it = statistics.median(loop(fn) for _ in range(REPEATS))
            # bytes as step_time counts them: gathered output, reduced input, the tensor otherwise
            nbytes = x.numel() * 4 * (world if kind == "all_gather" else 1)
            results.setdefault(kind, []).append((nbytes, max(with_it - alone, 1e-7) / 8))
    results["skew"] = _sync_skew(compute, dist) if drift else 0.0
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


def _sync_skew(compute, dist, calls: int = 12) -> float:
    """What a blocking collective costs per second of computation since the previous one: the
    ranks drift apart while they compute (time slices, the VM's other work) and the first to
    arrive waits for the last. A 4 MiB all-gather's mean time per call after ~8x the
    computation less after ~1x, over the computation added; the median of REPEATS such pairs
    (one pair read 0.04-0.12 from profile to profile), then the mean over the ranks. Measured:
    0.8-1.6 ms more per all-gather after 28 ms than after 2 ms of GEMMs on 2 processes here,
    which the FSDP jobs' 23 collectives a step paid (docs/step_time.md)."""
    x = torch.randn(1 << 20)
    out = torch.empty(x.numel() * dist.get_world_size())
    skews = []
    for _ in range(REPEATS):
        figures = []
        for repeat in (1, 8):
            seg, call = [], []
            dist.barrier()
            for _ in range(calls):
                t0 = time.perf_counter()
                for _ in range(repeat):
                    compute()
                t1 = time.perf_counter()
                dist.all_gather_into_tensor(out, x)
                seg.append(t1 - t0)
                call.append(time.perf_counter() - t1)
            figures.append((statistics.median(seg), statistics.mean(call[1:])))
        (seg1, call1), (seg8, call8) = figures
        skews.append(max(0.0, call8 - call1) / max(seg8 - seg1, 1e-6))
    skew = torch.tensor([statistics.median(skews)])
    dist.all_reduce(skew)
    return skew.item() / dist.get_world_size()


def _factor(kind: str, n: int) -> float:
    """step_time.collective_seconds' bytes factor of a collective on n ranks."""
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 2 * (n - 1) / n if kind == "all_reduce" else 1.0


def measure_gloo(world: int, drift: bool) -> dict:
    """{"gbps": bandwidth, "fixed_us": {kind: fixed cost}, "skew": wait per second computed}
    of gloo collectives between `world` processes on this machine, each issued between ~2 ms
    of computation on every process (what a step does: the cost includes waiting for the
    others and sharing the cores); skew: _sync_skew where `drift` (the processes have a core
    each), else 0: with more processes than cores the time slices' wait is already in the
    fixed costs (measured with every process computing). The CPU check's 4-rank jobs on 2
    cores were within -7..+7% without a skew and +8..+21% with the one 4 processes measure."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "gloo.json")
        mp.spawn(
            _gloo_worker,
            args=(world, os.path.join(tmp, "store"), out, drift),
            nprocs=world,
            join=True,
        )
        with open(out) as f:
            results = json.load(f)
    fixed, rates = {}, []
    skew = results.pop("skew")
    for kind, points in results.items():
        (b0, t0), (b1, t1) = sorted(points)
        factor = _factor(kind, world)
        rate = factor * (b1 - b0) / max(t1 - t0, 1e-9)
        rates.append(rate)
        fixed[kind] = max(0.0, (t0 - factor * b0 / rate)) * 1e6
    fixed["recv"] = fixed.get("send", 0.0)
    rates.sort()
    return {"gbps": rates[len(rates) // 2] / 1e9, "fixed_us": fixed, "skew": skew}
