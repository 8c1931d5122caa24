"""What one simulated training step computes and communicates, in order: the input of the
step-time model (step_time.py).

The memory simulation (simulate.py) runs one real training step of a rank on fake tensors;
its tracker (tracker.LiveBytes) hands every op on plain tensors to `OpTrace.seen`, which
sorts it into one of:

- a compute op, by class: `gemm` (mm, addmm, bmm, baddbmm), `grouped_gemm` (the routed
  experts' `torchtitan::grouped_mm` and its backward, aten's `_grouped_mm`), `attention`
  (CPU SDPA, forward and backward), `memory` (every other op that launches a kernel:
  elementwise, reductions, copies, FSDP's copy-in / copy-out, the optimizer's foreach ops),
  with the FLOPs it runs and the bytes it reads and writes, timed at once with the hardware
  profile (`op_seconds`); ops that launch no kernel (views, metadata, empty allocations)
  cost their host dispatch only (none in compiled blocks);
- a collective or P2P op (observe/comm_stats.py's `collective_kind`): its kind, process
  group and bytes, kept as an event of its own (step_time.py knows the links and what
  overlaps what).

FLOPs are those the kernels run (torch.utils.flop_counter has no formula for CPU SDPA or
grouped GEMM): GEMM 2mnk; grouped GEMM 2 x rows x in x out per pass (backward: 2 passes);
attention 2 x batch x heads x q x k x (qk_dim + v_dim) forward and 2 x ... x (3 qk_dim +
2 v_dim) backward, causal attention counting only the key blocks at or below the diagonal
(the flash kernels skip the others: `attention_block` of the profile); an explicit mask
(documents, context-parallel chunks: causal, lower-right aligned) runs every block on a CPU
and only the blocks on or below its diagonal on a GPU profile. An all-to-all moves the
larger of what the rank sends and receives (the busiest EP rank waits for its share).

Ops run while activation checkpointing recomputes a region are marked `recompute`.
Consecutive compute ops merge into one event; events are grouped in segments, one per phase
of the step (training/phases.py: forward, loss, backward, each pipeline action, the tail).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import torch
import torch.utils.checkpoint as torch_checkpoint
from torch.utils._pytree import tree_leaves

from torchtitan.hardware import HardwareProfile
from torchtitan.models.common.float8 import FLOAT8_CAST
from torchtitan.observe.comm_stats import collective_bytes, collective_kind, group_name_of
from torchtitan.training.phases import StepPhase

aten = torch.ops.aten

# phases whose ops run outside compiled code even in a compiled job: the optimizer and the
# tail's bookkeeping. (Clipping keeps the cost the model has always given it: as if compiled.)
UNCOMPILED = frozenset(
    {
        StepPhase.TIED_COPIES,
        StepPhase.NONFINITE,
        StepPhase.OPTIMIZER,
        StepPhase.FLOAT8_SCALES,
        StepPhase.EXPERT_BALANCE,
    }
)

REPLICA_GROUPS = "torchft_replica_groups"  # the process group name of the groups' all-reduces
_GEMM = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default}
_ATTENTION_FWD = {aten._scaled_dot_product_flash_attention_for_cpu.default}
_ATTENTION_BWD = {aten._scaled_dot_product_flash_attention_for_cpu_backward.default}
# ops that launch no kernel besides views: allocation without a fill, metadata, host reads
# the record_function names FSDP2 (torch 2.13) opens around each unit's hooks
_FSDP_HOOKS = (
    "FSDP::pre_forward",
    "FSDP::post_forward",
    "FSDP::pre_backward",
    "FSDP::post_backward_reshard",
)
_NO_KERNEL = {
    "empty",
    "empty_strided",
    "new_empty",
    "new_empty_strided",
    "empty_like",
    "detach",
    "alias",
    "lift_fresh",
    "_local_scalar_dense",
    "sym_size",
    "sym_stride",
    "sym_numel",
    "sym_storage_offset",
    "set_",
    "resize_",
    "record_stream",
    "_has_compatible_shallow_copy_type",
    "wait_tensor",
    "is_same_size",
    "_unsafe_view",
    "_reshape_alias",
    "lift_fresh_copy",
}


_FLOAT8 = {getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)}


def _float8_data(t) -> torch.Tensor | None:
    """The float8 tensor inside torchao's float8 training tensor (a wrapper whose dtype is the
    original precision's), None for any other tensor."""
    data = getattr(t, "_data", None)
    return data if isinstance(data, torch.Tensor) and data.dtype in _FLOAT8 else None


def _nbytes(x) -> int:
    leaves = [t for t in tree_leaves(x) if isinstance(t, torch.Tensor)]
    return sum(
        (d.numel() * d.element_size())
        if (d := _float8_data(t)) is not None
        # a float8 GEMM operand: the bytes of its float8 data, not of the wrapper's dtype
        else t.numel() * t.element_size()
        for t in leaves
    )


def _dtype_name(t: torch.Tensor) -> str:
    """The dtype an op computes in: "float8" for torchao's float8 operands (a GEMM on them runs
    at the profile's float8 peak), the tensor's dtype otherwise."""
    if _float8_data(t) is not None:
        return "float8"
    return str(t.dtype).removeprefix("torch.")


def causal_kept(q_len: int, k_len: int, block: int, lower_right: bool = False) -> float:
    """Fraction of the q x k score blocks a causal kernel computes (a block is computed when
    any of its entries is kept). Top-left aligned (SDPA's is_causal): query i sees keys <= i;
    lower-right (a context-parallel chunk's queries, the last k_len - q_len keys before them
    all seen): query i sees keys <= i + k_len - q_len."""
    nq, nk = math.ceil(q_len / block), math.ceil(k_len / block)
    shift = k_len - q_len if lower_right else 0
    kept = sum(min((min((i + 1) * block, q_len) - 1 + shift) // block + 1, nk) for i in range(nq))
    return kept / (nq * nk)


def gemm_flops(func, args) -> float:
    if func in (aten.mm.default,):
        a, b = args[0], args[1]
        return 2.0 * a.shape[0] * a.shape[1] * b.shape[1]
    if func is aten.addmm.default:
        a, b = args[1], args[2]
        return 2.0 * a.shape[0] * a.shape[1] * b.shape[1]
    if func is aten.bmm.default:
        a, b = args[0], args[1]
        return 2.0 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2]
    a, b = args[1], args[2]  # baddbmm
    return 2.0 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2]


def grouped_gemm_flops(name: str, args) -> float:
    if name == "grouped_mm":  # torchtitan: x [T, K], w [G, N, K]
        x, w = args[0], args[1]
        return 2.0 * x.shape[0] * x.shape[1] * w.shape[1]
    if name == "grouped_mm_backward":  # (grad [T, N], x [T, K], w, offs): grad_x and grad_w
        x, w = args[1], args[2]
        return 4.0 * x.shape[0] * x.shape[1] * w.shape[1]
    a, b = args[0], args[1]  # aten._grouped_mm
    if a.dim() == 2 and b.dim() == 2:  # [M, T] x [T, N] per group: every row once
        return 2.0 * a.shape[0] * a.shape[1] * b.shape[1]
    if a.dim() == 2:  # [T, K] x [G, K, N]
        return 2.0 * a.shape[0] * a.shape[1] * b.shape[-1]
    return 2.0 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[-1]


def attention_flops(args, kwargs, backward: bool, block: int, skips_masked: bool = False) -> float:
    """skips_masked: the kernel skips the blocks an explicit mask hides (a GPU's, as the flash
    kernels skip them; every explicit mask this project builds is causal, lower-right aligned:
    the document masks and the context-parallel chunks', models/common/attention.py); the CPU
    kernel runs every block of an explicit mask."""
    if backward:  # (grad_out, q, k, v, out, logsumexp, dropout_p, is_causal, attn_mask, scale)
        q, k, v = args[1], args[2], args[3]
        causal = bool(args[7]) if len(args) > 7 else bool(kwargs.get("is_causal", False))
        mask = args[8] if len(args) > 8 else kwargs.get("attn_mask")
    else:  # (q, k, v, dropout_p, is_causal, *, attn_mask, scale)
        q, k, v = args[0], args[1], args[2]
        causal = bool(args[4]) if len(args) > 4 else bool(kwargs.get("is_causal", False))
        mask = kwargs.get("attn_mask")
    b, h, sq, d = q.shape
    sk, dv = k.shape[-2], v.shape[-1]
    if causal and mask is None:
        kept = causal_kept(sq, sk, block)
    elif mask is not None and skips_masked:
        kept = causal_kept(sq, sk, block, lower_right=True)
    else:
        kept = 1.0
    per_pair = (3 * d + 2 * dv) if backward else (d + dv)
    return 2.0 * b * h * sq * sk * per_pair * kept


def op_seconds(
    kind: str,
    flops: float,
    nbytes: int,
    dtype: str,
    p: HardwareProfile,
    *,
    compiled: bool,
    head_dim: int = 0,
) -> tuple[float, float]:
    """(device seconds, host seconds) of one op on profile `p` (roofline: the larger of the
    FLOPs at the class's efficiency and the bytes at the memory efficiency), times the
    profile's time_factor (a measured profile's fitted constant; 1 on a GPU)."""
    device, host = _op_seconds(kind, flops, nbytes, dtype, p, compiled=compiled, head_dim=head_dim)
    return device * p.time_factor, host * p.time_factor


def _op_seconds(kind, flops, nbytes, dtype, p: HardwareProfile, *, compiled, head_dim):
    bandwidth = p.hbm_gbps * 1e9 * p.memory_efficiency
    if p.dram_gbps and nbytes > p.cache_bytes:  # a CPU op beyond the cache: DRAM's rate
        bandwidth = p.dram_gbps * 1e9 * p.memory_efficiency
    host = p.host_us_per_op * 1e-6 / (p.compiled_ops_per_kernel if compiled else 1.0)
    if kind == "memory":
        if p.step_memory_gbps:  # a CPU profile's rate measured inside a step (hardware.py)
            bandwidth = p.step_memory_gbps * 1e9
        return nbytes * (p.compiled_memory_fraction if compiled else 1.0) / bandwidth, host
    peak = p.peak_flops(dtype)
    if kind == "gemm":
        eff = p.gemm_efficiency * flops / (flops + p.gemm_half_gflop * 1e9)
    elif kind == "grouped_gemm":
        eff = p.grouped_gemm_efficiency * flops / (flops + p.gemm_half_gflop * 1e9)
    else:
        eff = p.attention_eff(head_dim)
    return max(flops / (peak * max(eff, 1e-9)), nbytes / bandwidth), p.host_us_per_op * 1e-6


@dataclass
class Compute:
    """Consecutive compute ops: seconds on the device, seconds recomputing (AC), host seconds
    (dispatch and launch), FLOPs."""

    device_s: float = 0.0
    recompute_s: float = 0.0
    host_s: float = 0.0
    flops: float = 0.0
    ops: int = 0


@dataclass
class Comm:
    kind: str  # all_gather, reduce_scatter, all_reduce, all_to_all, broadcast, send, recv
    group: str | None  # process-group name
    nbytes: int
    api: str  # "c10d" (eager process-group calls: FSDP2, DDP, pipelining), "torchtitan" (SimpleFSDP's gather), "functional"
    share: float = 1.0  # the share of steps it runs in (a semi-synchronous sync: 1 / its interval)


@dataclass
class Segment:
    label: str  # the step phase's label (training/phases.py: a phase, or a pipeline action's)
    action: tuple | None  # a pipeline action: (stage, "F" | "B" | "I" | "W", microbatch)
    events: list = field(default_factory=list)  # Compute and Comm, in order


class OpTrace:
    """Called by the memory tracker for every op (see the module docstring)."""

    def __init__(self, profile: HardwareProfile, compiled: bool):
        self.profile = profile
        self.compiled = compiled
        self.segments: list[Segment] = []
        self.recomputing = 0
        self.checkpointed = 0  # inside a checkpointed region's forward
        self.active = False
        # the last op's class (None: no kernel, a collective) and bytes read and written
        self.last_kind: str | None = None
        self.last_bytes = 0
        self.records: list = []  # open record_functions: a float8 cast's bytes, else None
        self.casts = 0  # float8 casts open now
        # the share of the steps what runs now runs in: 1, or a semi-synchronous sync's
        # 1 / (steps between syncs) (training/fault_tolerance.PlannedReplicaGroups)
        self.share = 1.0

    def _segment(self, label: str, action) -> Segment:
        if (
            not self.segments
            or self.segments[-1].label != label
            or self.segments[-1].action != action
        ):
            self.segments.append(Segment(label, action))
        return self.segments[-1]

    def _charge(self, label: str, action, device_s: float, host_s: float, flops=0.0) -> None:
        """Add one kernel's time to the segment's running Compute event (recompute time while
        a checkpointed region recomputes)."""
        seg = self._segment(label, action)
        last = seg.events[-1] if seg.events and isinstance(seg.events[-1], Compute) else None
        if last is None:
            last = Compute()
            seg.events.append(last)
        device_s, host_s, flops = device_s * self.share, host_s * self.share, flops * self.share
        if self.recomputing:
            last.recompute_s += device_s
        else:
            last.device_s += device_s
        last.host_s += host_s
        last.flops += flops
        last.ops += 1

    def _host(self, seconds: float, label: str, action) -> None:
        """Host time outside any op's kernel (DTensor's dispatch, a collective's hooks)."""
        seg = self._segment(label, action)
        last = seg.events[-1] if seg.events and isinstance(seg.events[-1], Compute) else None
        if last is None:
            last = Compute()
            seg.events.append(last)
        last.host_s += seconds * self.share

    def dtensor_op(self, label: str, action) -> None:
        """An op on DTensors: DTensor's own host time, then its local ops come through `seen`."""
        if self.active:
            self._host(self.profile.dtensor_us_per_op * 1e-6, label, action)

    def replica_groups_all_reduce(self, nbytes: int, tracker) -> None:
        """An all-reduce over the fault-tolerance replica groups (torchft's process group,
        outside the simulated world: training/fault_tolerance.PlannedReplicaGroups), at the
        tracker's phase, in `share` of the steps."""
        if self.active:
            self._segment(tracker.phase, tracker.action).events.append(
                Comm("all_reduce", REPLICA_GROUPS, nbytes, "c10d", self.share)
            )

    def seen(self, func, args, kwargs, out, *, label: str, action) -> None:
        self.last_kind = None
        if not self.active:
            return
        namespace, name = func._overloadpacket._qualified_op_name.split("::")
        kind = collective_kind(func, args)
        if kind is not None:
            group = group_name_of(args, {})
            if (
                namespace == "c10d"
            ):  # an eager process-group call: its caller's host work (FSDP2's hooks, DDP, pipelining)
                self._host(self.profile.host_us_per_collective * 1e-6, label, action)
            nbytes = collective_bytes(kind, func, args)
            if kind == "all_to_all":  # the busier side: a rank routed more than it sends waits
                nbytes = max(nbytes, _nbytes(out))  # for what it receives (planning.memory_skew)
            self._segment(label, action).events.append(
                Comm(
                    kind,
                    group,
                    nbytes,
                    namespace if namespace in ("c10d", "torchtitan") else "functional",
                )
            )
            return
        fused = self.compiled and label not in UNCOMPILED
        if namespace == "profiler" and self._float8_cast(name, args, fused, label, action):
            return
        if self.casts and fused:  # inside a compiled float8 cast: priced as its fused kernels
            return
        if (
            namespace == "profiler"
            and self.profile.host_us_per_fsdp_hook
            and args
            and isinstance(args[0], str)
            and args[0].startswith(_FSDP_HOOKS)
        ):  # an FSDP2 hook starts (its record_function): its Python around the ops it runs
            self._host(self.profile.host_us_per_fsdp_hook * 1e-6, label, action)
        if namespace == "prim" or name in _NO_KERNEL or getattr(func, "is_view", False):
            # no kernel, but dispatched all the same (profile.host_us_per_op is measured over every op)
            if not self.compiled or label in UNCOMPILED:
                self._host(self.profile.host_us_per_op * 1e-6, label, action)
            return
        if func in _GEMM:
            op, flops, dtype = (
                "gemm",
                gemm_flops(func, args),
                _dtype_name(args[-1] if func is aten.mm.default else args[1]),
            )
        elif name in ("grouped_mm", "grouped_mm_backward", "_grouped_mm"):
            op, flops, dtype = "grouped_gemm", grouped_gemm_flops(name, args), _dtype_name(args[0])
        elif func in _ATTENTION_FWD or func in _ATTENTION_BWD:
            op = "attention"
            flops = attention_flops(
                args,
                kwargs,
                func in _ATTENTION_BWD,
                self.profile.attention_block,
                skips_masked=self.profile.host_async,
            )
            dtype = _dtype_name(args[0])
            head_dim = args[0].shape[-1]
        else:
            op, flops, dtype = "memory", 0.0, "bfloat16"
        nbytes = _nbytes(args) + _nbytes(kwargs) + _nbytes(out)
        self.last_kind, self.last_bytes = op, nbytes
        device_s, host_s = op_seconds(
            op,
            flops,
            nbytes,
            dtype,
            self.profile,
            compiled=self.compiled and label not in UNCOMPILED,
            head_dim=head_dim if op == "attention" else 0,
        )
        if (self.checkpointed or self.recomputing) and not self.compiled:
            host_s += self._ac_host_s()
        self._charge(label, action, device_s, host_s, flops)

    def _float8_cast(self, name: str, args, fused: bool, label: str, action) -> bool:
        """A record_function opens or closes; True when it is a float8 cast's
        (simulate/patches.float8_casts_marked). Every record_function is kept on a stack
        (they nest), so a cast's exit is told apart from another's (its handle object is not
        the one its enter returned). Compiled, the outermost cast is priced as inductor runs
        it: the bytes its amax and cast passes move, one kernel's launch; eager, its ops are
        priced one by one as they come (the markers cost nothing)."""
        if name == "_record_function_enter_new":
            text = str(args[0]) if args else ""
            cast = text.startswith(FLOAT8_CAST)
            self.records.append(int(text.split()[-1]) if cast else None)
            if cast:
                self.casts += 1
            return cast
        if name != "_record_function_exit" or not self.records:
            return False
        moved = self.records.pop()
        if moved is None:
            return False
        self.casts -= 1
        if fused and not self.casts:
            device_s = op_seconds("memory", 0.0, moved, "bfloat16", self.profile, compiled=False)[0]
            host_s = op_seconds("memory", 0.0, 0, "bfloat16", self.profile, compiled=True)[1]
            self._charge(label, action, device_s, host_s)
        return True

    def _ac_host_s(self) -> float:
        """Host time checkpointing adds to an op of a checkpointed region: an op-level policy's
        dispatch modes when one is on the mode stack, else whole-region checkpointing's hooks."""
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        sac = any(
            type(m).__name__ in ("_CachingTorchDispatchMode", "_CachedTorchDispatchMode")
            for m in _get_current_dispatch_mode_stack()
        )
        return (self.profile.sac_us_per_op if sac else self.profile.ac_us_per_op) * 1e-6

    @contextlib.contextmanager
    def recording(self):
        """Trace inside; ops run by activation checkpointing's recomputation are marked, and
        those of a checkpointed region's forward are known (`checkpointed`)."""
        trace = self
        patched = []
        for hook, counter in (
            (torch_checkpoint._recomputation_hook, "recomputing"),
            (torch_checkpoint._checkpoint_hook, "checkpointed"),
        ):
            enter, exit_ = hook.__enter__, hook.__exit__

            def entered(h, enter=enter, counter=counter):
                setattr(trace, counter, getattr(trace, counter) + 1)
                return enter(h)

            def exited(h, *exc, exit_=exit_, counter=counter):
                setattr(trace, counter, getattr(trace, counter) - 1)
                return exit_(h, *exc)

            hook.__enter__, hook.__exit__ = entered, exited
            patched.append((hook, enter, exit_))
        self.active = True
        try:
            yield self
        finally:
            self.active = False
            for hook, enter, exit_ in patched:
                hook.__enter__, hook.__exit__ = enter, exit_
