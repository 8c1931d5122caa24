"""What the memory simulation changes so that one training step runs on fake tensors.

Simulated by the code that runs (unchanged): every module, TP, AC / SAC policies, FSDP2 and
SimpleFSDP gathers and frees, the pipeline schedules' order and buffers, the optimizer.
Changed here, only inside a simulation:

- `torch._grouped_mm` called directly (a user model's experts): its meta kernel (torch 2.13)
  accepts bfloat16 only; a fake-tensor implementation gives float32 the same output shape
  (the real CPU kernel computes both). The framework's MoE layers need no patch: they call
  `torchtitan::grouped_mm` (models/common/grouped_mm.py), whose own fake implementation
  serves fake tensors in every dtype (same prediction to the byte: dsv3 EP2, 8,929,280 B).
- expert-parallel dispatch: the split sizes come from a host sync on routed counts
  (`.tolist()`), which fake tensors do not have; `PlannedDispatcher` uses the planned load
  instead: balanced (every EP rank receives its share), or skewed (this rank receives
  `skew` times its share; the rest is spread over the others).
- pipeline start-up: the schedule's first step votes on shape inference with `.item()` and
  exchanges stage metadata with its neighbours by P2P. The simulation votes as every real
  run does (dynamic inference) and hands a stage the metadata its neighbour would send: a
  block's output (forward) and that tensor's gradient (backward), taken from the first
  stage the simulation ran (every stage boundary carries the same hidden state).
- context parallel on a CUDA target: each chunk attends with torch's lower-right causal bias,
  never materialized; the CPU tensors of the simulation build the mask instead, uncounted
  (`cuda_causal_bias`).
- float8 casts (torchao) are marked for the step-time trace: each runs inside a
  record_function named `FLOAT8_CAST` with the bytes its fused kernels move, so a compiled
  job's cast is priced as inductor runs it, one amax read and one cast pass, rather than as
  its eager ops (`float8_casts_marked`); nothing else changes.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed._functional_collectives as funcol
from torch._subclasses import fake_impls
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.distributed.pipelining import schedules as pp_schedules
from torch.distributed.pipelining import stage as pp_stage
from torch.distributed.pipelining._utils import (
    _derive_grad_metas,
    _StageBackwardMeta,
    _StageForwardMeta,
)

from torchtitan.distributed.expert_parallel import AllToAllDispatcher, wait_collective
from torchtitan.models.common.float8 import FLOAT8_CAST

aten = torch.ops.aten


# positional: torch's fake-tensor dispatch calls it with aten._grouped_mm's own arguments
def _grouped_mm_fake(fake_mode: FakeTensorMode, func, a, b, offs=None, bias=None, out_dtype=None):
    with fake_impls.in_kernel_invocation_manager(fake_mode):
        if a.dtype == torch.bfloat16:  # the meta kernel's own path
            out = func(a, b, offs=offs, bias=bias, out_dtype=out_dtype)
        else:
            if a.dim() == 2 and b.dim() == 3:
                shape = [a.size(0), b.size(-1)]
            elif a.dim() == 3 and b.dim() == 2:
                shape = [a.size(1), b.size(1)]
            elif a.dim() == 2:
                shape = [offs.size(0), a.size(0), b.size(1)]
            else:
                shape = [a.size(0), a.size(1), b.size(-1)]
            out = torch.empty(shape, dtype=out_dtype or a.dtype, device="meta")
    return FakeTensor(fake_mode, out, a.fake_device)


def register_fake_kernels() -> None:
    """Once per process; affects fake tensors only."""
    if aten._grouped_mm.default not in fake_impls.op_implementations_dict:
        fake_impls.register_op_impl(aten._grouped_mm.default)(_grouped_mm_fake)


def planned_splits(rows: int, world: int, rank: int, skew: float) -> tuple[list[int], list[int]]:
    """(rows this rank sends to each EP rank, rows it receives from each) under the planned
    load: every rank routes `rows` token copies; this rank receives `skew` times its share."""
    send = [rows // world + (1 if r < rows % world else 0) for r in range(world)]
    receive_total = min(rows * world, round(rows * skew))
    recv = [receive_total // world + (1 if r < receive_total % world else 0) for r in range(world)]
    return send, recv


class PlannedDispatcher(AllToAllDispatcher):
    """AllToAllDispatcher with the planned split sizes instead of the routed ones (the
    collectives, buffers, regrouping and experts run as in training)."""

    def __init__(self, base: AllToAllDispatcher, rank: int, skew: float):
        self.mesh, self.group, self.size, self.num_experts = (
            base.mesh,
            base.group,
            base.size,
            base.num_experts,
        )
        self.rank, self.skew = rank, skew
        # expert tensor parallel: each row goes to every TP rank of its EP rank (the copies
        # the base dispatcher makes); the planned splits spread all of them evenly
        self.replicas = base.replicas

    def route(self, counts: torch.Tensor, n_rows: int) -> tuple[torch.Tensor, list[int], list[int]]:
        w, e_local = self.size, self.num_experts // (self.size // self.replicas)
        wait_collective(
            funcol.all_to_all_single(counts, None, None, self.group)
        )  # the counts exchange, as in training
        in_splits, out_splits = planned_splits(n_rows, w, self.rank, self.skew)
        # what each source sends to each local expert: its rows spread evenly over them
        recv = torch.tensor(
            [
                [n // e_local + (1 if e < n % e_local else 0) for e in range(e_local)]
                for n in out_splits
            ],
            dtype=counts.dtype,
            device=counts.device,
        )
        return recv, in_splits, out_splits


def plan_dispatch(modules, rank: int, skew: float) -> None:
    for module in modules:
        for sub in module.modules():
            dispatcher = getattr(sub, "dispatcher", None)
            if isinstance(dispatcher, AllToAllDispatcher):
                sub.dispatcher = PlannedDispatcher(dispatcher, rank, skew)


@contextlib.contextmanager
def as_pipeline_rank(pp_group, pp_rank: int):
    """Stages and schedules built here see this process as rank `pp_rank` of the pipeline
    group (the simulation plays every pipeline rank from one process)."""
    original = torch.distributed.get_rank

    def get_rank(group=None):
        return pp_rank if group is pp_group else original(group)

    torch.distributed.get_rank = get_rank
    try:
        yield
    finally:
        torch.distributed.get_rank = original


class PipelineStartup:
    """Stage metadata without P2P (module docstring). One per simulated job: the boundary
    metadata learnt from the first stage is reused by every later one."""

    def __init__(self):
        self.forward: _StageForwardMeta | None = None

    @contextlib.contextmanager
    def patched(self):
        startup = self
        orig_send, orig_recv = pp_stage.PipelineStage._send_meta, pp_stage.PipelineStage._recv_meta
        orig_warmup = pp_schedules._PipelineSchedule._warmup_p2p

        def send_meta(stage, meta, dst_stage):
            if isinstance(meta, _StageForwardMeta) and startup.forward is None:
                startup.forward = meta

        def recv_meta(stage, src_stage):
            if startup.forward is None:
                raise RuntimeError("memory simulation: simulate the first pipeline stage first")
            if src_stage < stage.stage_index:
                return startup.forward
            return _StageBackwardMeta(
                backward_metas=_derive_grad_metas(startup.forward.forward_metas)
            )

        def warmup(schedule, stages, has_backward, p2p_done):
            for s in stages:  # every real run votes DYNAMIC (no static shapes are given)
                s._inference_mode = pp_stage.InferenceMode.DYNAMIC

        pp_stage.PipelineStage._send_meta, pp_stage.PipelineStage._recv_meta = send_meta, recv_meta
        pp_schedules._PipelineSchedule._warmup_p2p = warmup
        try:
            yield
        finally:
            pp_stage.PipelineStage._send_meta, pp_stage.PipelineStage._recv_meta = (
                orig_send,
                orig_recv,
            )
            pp_schedules._PipelineSchedule._warmup_p2p = orig_warmup


@contextlib.contextmanager
def cuda_causal_bias(tracker, target: str):
    """A CUDA job's context-parallel chunks attend with a lower-right causal bias, never a
    materialized mask; simulated on CPU tensors they build the mask: left uncounted."""
    from torchtitan.distributed import context_parallel

    original = context_parallel.causal_chunk_mask
    if target != "cuda":
        yield
        return

    def uncounted(*args, **kwargs):
        with tracker.paused():
            return original(*args, **kwargs)

    context_parallel.causal_chunk_mask = uncounted
    try:
        yield
    finally:
        context_parallel.causal_chunk_mask = original


# torchao's cast functions and the modules that call them by name (torchao 0.18): each wrapped
# in place while a simulation runs. (module, function, amax pass, cast pass)
_FLOAT8_CASTS = (
    ("torchao.float8.float8_linear", "hp_tensor_to_float8_dynamic", True, True),
    ("torchao.float8.float8_tensor_parallel", "hp_tensor_to_float8_dynamic", True, True),
    ("torchao.float8.fsdp_utils", "hp_tensor_to_float8_dynamic", True, True),
    ("torchao.float8.fsdp_utils", "hp_tensor_and_scale_to_float8", False, True),
    ("torchao.float8.float8_scaling_utils", "tensor_to_scale", True, False),
    ("torchao.float8.float8_scaling_utils", "hp_tensor_and_scale_to_float8", False, True),
)


def _local_bytes(t) -> int:
    local = getattr(t, "_local_tensor", t)
    return local.numel() * local.element_size() if isinstance(local, torch.Tensor) else 0


@contextlib.contextmanager
def float8_casts_marked():
    """Wrap torchao's float8 casts (when torchao is in use) in a record_function that names
    the bytes the cast moves once fused: an amax pass reads the high-precision input, a cast
    pass reads it again and writes one byte per element."""
    import sys

    patched = []

    def marked(fn, amax: bool, cast: bool):
        def wrapper(x, *args, **kwargs):
            hp = _local_bytes(x)
            elements = hp // max(getattr(x, "element_size", lambda: 1)(), 1)
            moved = hp * (int(amax) + int(cast)) + (elements if cast else 0)
            with torch.profiler.record_function(f"{FLOAT8_CAST} {moved}"):
                return fn(x, *args, **kwargs)

        return wrapper

    try:
        for module_name, name, amax, cast in _FLOAT8_CASTS:
            module = sys.modules.get(module_name)
            if module is not None and hasattr(module, name):
                original = getattr(module, name)
                patched.append((module, name, original))
                setattr(module, name, marked(original, amax, cast))
        yield
    finally:
        for module, name, original in reversed(patched):
            setattr(module, name, original)
