"""One training step of one pipeline rank, run on fake tensors, with its live bytes tracked.

The rank's parts are built by the trainer's build path (`build_parts`: split, plan, TP, AC,
FSDP / SimpleFSDP / DDP, EP), materialised as fake tensors (shapes and dtypes, no memory),
given AdamW states as after step 1, and run through the trainer's own step code
(`StepRunner.forward_backward`, then training/step_tail.py's `step_tail`: the tied copies,
gradient clipping, the non-finite record, the optimizer, the expert balance). `LiveBytes`
counts every storage the step creates until it dies; the peak of a step >= 2 is what is
alive at its start (parameters, optimizer states, buffers, the step's input batches) plus
the most the step adds. simulation_patches.py lists the three paths that run changed
(grouped GEMM in float32, expert-parallel split sizes, pipeline start-up).

Eager mode: the simulation runs the job with torch.compile off (compiled kernels fuse and
free their intermediates differently; see docs/memory.md).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import gc
import warnings
from dataclasses import dataclass, field

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily
from torch.distributed.tensor import DTensor

from torchtitan.distributed.simple_fsdp import GATHER_OP
from torchtitan.distributed.tensor_parallel import loss_parallel_context
from torchtitan.models.common.float8 import plain_tensor, precompute_scales, precompute_scales_on
from torchtitan.models.common.moe import moe_modules
from torchtitan.observe.cpu_memory import CpuPeakMeter
from torchtitan.planning.simulate import patches as simulation_patches
from torchtitan.planning.simulate.tracker import LiveBytes
from torchtitan.training.build import build_parts, plan_records, step_runner
from torchtitan.training.expert_balance import ExpertBalancer
from torchtitan.training.fault_tolerance import PlannedReplicaGroups
from torchtitan.training.nonfinite import NonFiniteWatch
from torchtitan.training.optimizer import PartOptimizers
from torchtitan.training.phases import BACKWARD, TAIL, StepPhase, label, phase_of
from torchtitan.training.planned_job import PlannedJob
from torchtitan.training.step import StepRunner
from torchtitan.training.step_tail import step_tail, tied_copies

_c10d = torch.ops.c10d
_fc = torch.ops._c10d_functional
_GATHERS = {_fc.all_gather_into_tensor.default, _fc.all_gather_into_tensor_coalesced.default}
_A2A = {_fc.all_to_all_single.default}

# categories of the breakdown, in the order they are printed
CATEGORIES = (
    "parameters",
    "optimizer_states",
    "gradients",
    "unsharded_parameters",
    "activations",
    "logits_and_loss",
    "backward_transients",
    "ep_dispatch",
    "pipeline_buffers",
    "optimizer_transients",
    "inputs_and_buffers",
    "checkpoint_staging",
)


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


# SimpleFSDP's gather (one custom op: cast + concat, all-gather, copy-out) holds its flat
# gathered buffer (the size of its outputs) while it copies the outputs out of it.
_WORKSPACES = {GATHER_OP: _nbytes}


@dataclass
class SimulatedStep:
    """The simulated step of one pipeline rank."""

    pp_rank: int
    stage_ids: list[int]
    peak_bytes: int
    peak_at: str  # the step phase running when the peak was reached
    breakdown: dict[str, int]  # live bytes per category at the peak
    start_bytes: int  # alive when the step starts
    plan_records: list[dict] = field(default_factory=list)  # plan.json entries of the rank's parts
    allocator_peak_bytes: int | None = None  # `profile` runs: the CPU allocator's own count
    times: object = None  # what the caller's timer made of the step (planning/step_time/rank.py)
    schedule: tuple | None = None  # (every pipeline rank's actions, number of stages), with a timer
    # the peaks before the step tail ("body") and in it ("tail"): (bytes, phase, breakdown)
    points: dict = field(default_factory=dict)


# what a storage made in a phase is, unless its op says otherwise; the step tail's are
# transients of the update (the tied copies' sum, the norm, the expert counts)
_BY_PHASE = {
    StepPhase.SETUP: "inputs_and_buffers",
    StepPhase.FORWARD: "activations",
    StepPhase.LOSS: "logits_and_loss",
    StepPhase.PIPELINE: "pipeline_buffers",
    **{phase: "backward_transients" for phase in BACKWARD},
    **{phase: "optimizer_transients" for phase in TAIL},
}


class _Categories:
    """Category of a storage created by `op` during the phase labelled `phase` (see CATEGORIES)."""

    def __init__(self, fsdp_groups: set[str]):
        self.fsdp_groups = fsdp_groups

    def __call__(self, op, phase: str, args=()) -> str:
        if op is None:  # a storage resized from nothing: FSDP2's unsharded parameters
            return "unsharded_parameters"
        if op in _GATHERS and args and args[-1] in self.fsdp_groups:
            return "unsharded_parameters"
        if op in _A2A:
            return "ep_dispatch"
        if getattr(op, "namespace", "") == "fsdp":  # FSDP2's all-gather in/out buffers
            # the bare label only: a pipeline's backward of a microbatch keeps them unsharded
            return "unsharded_parameters" if phase != StepPhase.BACKWARD else "backward_transients"
        return _BY_PHASE[phase_of(phase)]


def _label_pipeline_phases(schedule, tracker: LiveBytes) -> None:
    """Name the schedule's actions as the step phase (forward / loss / backward of a
    microbatch) and the pipeline action running (stage, F/B/I/W/R, microbatch); between them
    the schedule's own work (P2P buffers) is "pipeline". The loss belongs to the last
    stage's forward of its microbatch."""
    stages = getattr(schedule, "_stages", None) or [schedule._stage]

    def backward_kind(args, kwargs) -> str:
        full = kwargs.get("full_backward", args[2] if len(args) > 2 else True)
        return "B" if full else "I"

    def wrap(owner, name: str, phase: StepPhase, kind):
        original = getattr(owner, name)

        def run(*args, **kwargs):
            mb = args[0] if kind != "R" and args and isinstance(args[0], int) else None
            tracker.phase = label(phase, mb, getattr(owner, "stage_index", None))
            if kind is not None:
                tracker.action = (
                    owner.stage_index,
                    kind(args, kwargs) if callable(kind) else kind,
                    mb,
                )
            try:
                return original(*args, **kwargs)
            finally:
                tracker.phase = StepPhase.PIPELINE
                if kind is not None and kind != "F":
                    tracker.action = None

        setattr(owner, name, run)

    for stage in stages:
        wrap(stage, "forward_one_chunk", StepPhase.FORWARD, "F")
        wrap(stage, "backward_one_chunk", StepPhase.BACKWARD, backward_kind)
        wrap(stage, "backward_weight_one_chunk", StepPhase.BACKWARD_WEIGHTS, "W")
        wrap(stage, "perform_reduce_grad", StepPhase.GRADIENT_REDUCTION, "R")
    wrap(schedule, "_compute_loss", StepPhase.LOSS, None)


def _first_step_setup(runner: StepRunner, parts, batch, cfg, startup) -> None:
    from torch.distributed.fsdp import FSDPModule

    if runner.pipeline is None:
        roots = [m for m in parts.modules if isinstance(m, FSDPModule)]
        if len(roots) == len(parts.modules):
            for m in roots:
                m._get_fsdp_state()._lazy_init()
        else:  # DDP / SimpleFSDP / replicate: a whole first micro-batch, as training does
            runner.forward_backward([batch])
        return
    mb = cfg.parallelism.pipeline_parallel_microbatch_size
    inputs, labels, kwargs = runner.prepare(batch[0][:mb], batch[1][:mb])
    layout = parts.layout
    args = (inputs,) if 0 in parts.stage_ids else ()
    target = labels if layout.num_stages - 1 in parts.stage_ids else None
    init = getattr(runner.pipeline, "_initialize_stages", None) or runner.pipeline._initialize_stage
    with startup.patched(), loss_parallel_context(runner.loss_parallel):
        init(args, kwargs, target)


def _end(meter) -> int | None:
    if meter is None:
        return None
    peak = meter.end_step()
    meter.close()
    return peak


def _storages(tensors):
    for t in tensors:
        if isinstance(t, DTensor):
            t = t._local_tensor
        t = plain_tensor(t)  # torchao's float8 all-gather weight: the tensor it wraps
        if isinstance(t, torch.Tensor):
            yield t


def simulate_pp_rank(
    job: PlannedJob,
    pp_rank: int,
    startup: simulation_patches.PipelineStartup,
    *,
    ep_skew: float = 1.0,
    profile: bool = False,
    free_bytes: int = 0,
    budget_note: str = "",
    timer=None,
) -> SimulatedStep:
    """The peak of one training step (>= 2) of pipeline rank `pp_rank` of `job`, as seen from
    its first data/tensor/expert-parallel coordinate (the others hold the same shapes).

    profile=True is the deterministic reference the tests compare with: the same step on
    REAL tensors (on the fake process group: collectives move nothing), measured by the CPU
    allocator's own count (observe/cpu_memory.py, the trainer's meter) as well as by the
    tracker.

    timer: an object with `observer(cfg)` (told every op with its phase) and
    `times(observer, dims, cfg, pipeline) -> (times, schedule)`: the step is also timed
    (planning/step_time/rank.py's RankTimer) into SimulatedStep.times and .schedule."""
    simulation_patches.register_fake_kernels()
    cfg, dims, target, model = job.cfg, job.dims, job.target, job.model
    eager = dataclasses.replace(cfg, compile=dataclasses.replace(cfg.compile, enable=False))
    experts = bool(moe_modules(model))  # the trainer balances the experts of a MoE model
    if dims.pp == 1:  # without a pipeline split, parallelizing changes the model itself
        model = copy.deepcopy(model)
    parts = build_parts(
        job.with_model(model, cfg=eager),
        pp_rank,
        free_bytes=free_bytes,
        budget_note=budget_note,
    )
    shape = job.batch
    t = cfg.training
    mode = FakeTensorMode(allow_non_fake_inputs=True) if not profile else contextlib.nullcontext()
    device = torch.device("cpu")
    tracker = LiveBytes(
        _Categories(set(dims.fsdp_group_names())), None if profile else mode, _WORKSPACES
    )
    with mode:
        for m in parts.modules:
            m.to_empty(device=device)
            m.train()
        simulation_patches.plan_dispatch(
            parts.modules, dims.ep_rank() if dims.ep > 1 else 0, ep_skew
        )
        with simulation_patches.as_pipeline_rank(dims.pp_group(), pp_rank):
            runner = step_runner(
                parts,
                job.with_model(model, cfg=eager),  # eager: the loss is not compiled either
                device,
                doc_delimiter=(0, True),
                on_phase=lambda phase: setattr(tracker, "phase", phase),
            )
        pipeline = runner.pipeline
        optimizers = PartOptimizers(parts.modules, cfg.optimizer, t.steps, cfg.lr_scheduler)
        # the rest of the trainer's step tail (train.py), on this rank's parts
        nonfinite = NonFiniteWatch(device)
        with unset_fake_temporarily():  # a new process group computes on its mesh's real tensor
            tied = tied_copies(parts.modules, dims)
            balancer = (
                ExpertBalancer(parts.modules, device, dims.batch_group(), dims.pp_group())
                if experts
                else None
            )
        params = [p for m in parts.modules for p in m.parameters()]
        for p in params:  # AdamW states as after step 1
            p.grad = torch.zeros_like(p)
        for o in optimizers.optimizers:
            o.step()
        float8_scales = precompute_scales_on(
            cfg.quantize.linear.float8, cfg.model.converters, dims.dp_shard
        )
        if float8_scales:  # ... and step 1's tail: the scales step 2's gathers cast with
            precompute_scales(parts.modules)
        for p in params:
            p.grad = None
        batches = [
            (
                torch.zeros(t.local_batch_size, t.seq_len, dtype=torch.int64),
                torch.zeros(t.local_batch_size, t.seq_len, dtype=torch.int64),
            )
            for _ in range(shape.accum_steps)
        ]
        if pipeline is not None:
            _label_pipeline_phases(pipeline, tracker)
        trace = timer.observer(cfg) if timer is not None else None
        tracker.observer = trace
        # what the first step does once: pipeline shape inference, FSDP2's lazy init (untracked)
        _first_step_setup(runner, parts, batches[0], cfg, startup)
        del model
        gc.collect()
        states = [v for o in optimizers.optimizers for s in o.state.values() for v in s.values()]
        replicas = None
        if cfg.fault_tolerance.enable:  # the trainer's (training/fault_tolerance.py), simulated
            replicas = PlannedReplicaGroups(
                cfg.fault_tolerance, parts.modules, optimizers, trace=trace, where=tracker
            )
            states += replicas.outer_states()
        # DiLoCo's global weights: host memory beside a GPU (not the device's); on CPU the same
        host_only = (
            {id(t) for t in replicas.host_copies()} if replicas and target != "cpu" else set()
        )
        tracker.adopt(_storages(params), "parameters")
        tracker.adopt(_storages(states), "optimizer_states")
        with warnings.catch_warnings():  # isinstance on deprecated torch.distributed names warns
            warnings.simplefilter("ignore")
            live = [
                o
                for o in gc.get_objects()
                if isinstance(o, torch.Tensor)
                and (profile or isinstance(o, FakeTensor) and o.fake_mode is mode)
                and id(o) not in host_only
            ]
        # FSDP2's unsharded parameters are freed storages (size 0) that it resizes to gather
        empty = [t for t in _storages(live) if t.untyped_storage().nbytes() == 0]
        tracker.adopt(empty, "unsharded_parameters")
        tracker.adopt(live, "inputs_and_buffers")
        del live
        start = tracker.live
        meter = CpuPeakMeter() if profile else None
        if meter is not None:
            meter.begin_step()
        with (
            tracker,
            startup.patched(),
            simulation_patches.cuda_causal_bias(tracker, target),
            simulation_patches.float8_casts_marked(),
            trace.recording() if trace is not None else contextlib.nullcontext(),
        ):
            tracker.phase = StepPhase.FORWARD
            sums = runner.forward_backward(batches)
            tracker.relabel(_storages(p.grad for p in params), "gradients")
            step_tail(  # the trainer's own (train.py's train_step), step 2
                sums,
                2,
                parts.modules,
                optimizers,
                t.max_norm,
                pp_group=dims.pp_group() if pipeline is not None else None,
                nonfinite=nonfinite,
                tied=tied,
                balancer=balancer,
                float8_scales=float8_scales,
                replicas=replicas,
                on_phase=lambda phase: setattr(tracker, "phase", phase),
            )

    def at(peak: int, event: int | None) -> tuple[int, dict]:
        breakdown = tracker.breakdown_at_peak(event)
        breakdown["checkpoint_staging"] = staged = checkpoint_staging_bytes(
            cfg, target, breakdown, params
        )
        on_host = host_offloaded_bytes(cfg, target, breakdown)  # (zeroes those categories)
        return peak + staged - on_host, {k: breakdown.get(k, 0) for k in CATEGORIES}

    peak, breakdown = at(tracker.peak, None)
    points = {}
    for name, (nbytes, phase, event) in tracker.points.items():
        points[name] = (*at(nbytes, event), str(phase))
    times, schedule = timer.times(trace, dims, cfg, pipeline) if timer is not None else (None, None)
    return SimulatedStep(
        pp_rank,
        parts.stage_ids,
        peak,
        str(tracker.peak_phase),
        breakdown,
        start,
        plan_records(parts),
        _end(meter),
        times,
        schedule,
        points,
    )


# What FSDP2's CPU offload keeps in host memory through the step: the sharded parameters,
# their gradients (copied to the host after each reduce-scatter), AdamW's states and the
# update's own transients (the optimizer steps on the host).
OFFLOADED = ("parameters", "gradients", "optimizer_states", "optimizer_transients")


def host_offloaded_bytes(cfg, target: str, breakdown: dict[str, int]) -> int:
    """training.enable_cpu_offload on an accelerator: the bytes of `breakdown` (at the
    simulated peak) that live on the host instead, set to 0 in it; on CPU every byte is the
    same memory, so 0. The device peak is then taken at the same moment of the step (the
    gathered parameters and the activations set it)."""
    if not cfg.training.enable_cpu_offload or target == "cpu":
        return 0
    host = sum(breakdown.get(k, 0) for k in OFFLOADED)
    for k in OFFLOADED:
        breakdown[k] = 0
    return host


def checkpoint_staging_bytes(cfg, target: str, breakdown: dict[str, int], params) -> int:
    """What an asynchronous checkpoint (checkpoint/async_saves.py) adds to every step from its first
    save on, on CPU, when a save falls before the last step (which saves synchronously): the staged copy of the parameters and optimizer states (each storage
    once, as DCP's stager copies them), and while it is written the largest parameter storage
    once more (DCP's writer copies a tensor whose storage is larger than itself - FSDP's
    padded shards - one at a time). On CUDA the copy is host memory: 0 here (the dry run
    says how much)."""
    c = cfg.checkpoint
    background = (
        c.enable
        and c.async_mode in ("async", "async_with_pinned_mem")
        and c.interval < cfg.training.steps
    )  # the last save is sync
    if not background or target != "cpu":
        return 0
    largest = max((t.untyped_storage().nbytes() for t in _storages(params)), default=0)
    return breakdown.get("parameters", 0) + breakdown.get("optimizer_states", 0) + largest
