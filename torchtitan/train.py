"""The trainer: config -> mesh -> model on meta -> plan + parallelize -> materialise -> train loop.

Launched by run_train.sh as `torchrun ... -m torchtitan.train --job.config_file X [overrides]`.
Every rank runs `main`: the checks again, then the Trainer (or, with
checkpoint.create_seed_checkpoint, `write_seed_checkpoint`).
"""

import contextlib
import dataclasses
import logging
import os
import sys
import time
import warnings

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from torchtitan import hardware, log
from torchtitan.checkpoint.files import CheckpointError, run_record
from torchtitan.checkpoint.manager import CheckpointManager
from torchtitan.checkpoint.states import TrainState
from torchtitan.checks import load_config_or_exit
from torchtitan.config import JobConfig
from torchtitan.config.toml_writer import config_toml
from torchtitan.data.dataloader import build_dataloader, loader_options, resolve_workers
from torchtitan.data.datasets import DataError
from torchtitan.data.tokenizer import load_model_tokenizer
from torchtitan.data.validation import Validator
from torchtitan.distributed.compile import compile_log_lines
from torchtitan.distributed.data_parallel import reshard_after_eval
from torchtitan.distributed.job_shape import replica_groups
from torchtitan.distributed.parallel_dims import ParallelDims
from torchtitan.distributed.process_groups import (
    DeviceError,
    comm_failure_summary,
    init_distributed,
    is_comm_failure,
    pick_device,
    set_collective_timeout,
    shutdown_distributed,
    start_flight_recorder,
)
from torchtitan.models.common.float8 import precompute_scales_on
from torchtitan.models.flavors import flavors_of
from torchtitan.models.hf.converters import export_args, export_fields, model_rules
from torchtitan.models.hf.weights import HFExportError, HFSpec
from torchtitan.observe.comm_stats import CommStats
from torchtitan.observe.metrics import (
    MetricsLogger,
    StepMemoryLog,
    peak_tflops,
    tensorboard_folder,
)
from torchtitan.observe.profiling import Profiler
from torchtitan.observe.step_clock import StepClock, StepTimeCheck
from torchtitan.planning.startup import (
    MemoryBudgetError,
    estimate_lines,
    share,
    start_prediction,
    wanted,
)
from torchtitan.resilience import exit_status, faults
from torchtitan.resilience.hang_watchdog import HangWatchdog
from torchtitan.resilience.preemption import Preemption, kill_wait_note, stop_line
from torchtitan.resilience.timeouts import hang_timeout
from torchtitan.training.build import ModelParts, build_parts, plan_records, step_runner
from torchtitan.training.expert_balance import ExpertBalancer
from torchtitan.training.fault_tolerance import DataPositions, ReplicaGroups
from torchtitan.training.garbage import GarbageSchedule
from torchtitan.training.loss import global_sum
from torchtitan.training.lr_schedule import schedule_steps
from torchtitan.training.nonfinite import NonFiniteLossError, NonFiniteWatch
from torchtitan.training.optimizer import PartOptimizers
from torchtitan.training.plan_report import report_plan
from torchtitan.training.planned_job import PlannedJob, model_on_meta
from torchtitan.training.semi_sync import SemiSyncState, semi_sync_of
from torchtitan.training.step import StepResult
from torchtitan.training.step_tail import step_tail, tied_copies
from torchtitan.units import GIB

logger = logging.getLogger("torchtitan.train")  # by name: run as __main__ too

warnings.filterwarnings("ignore", message=".*set_vital.*")


# The start-up memory prediction's child process (memory/startup.py)
PREDICTION_CHILD = [sys.executable, "-m", "torchtitan.predict_rank_roles"]


def join_job(cfg: JobConfig, device: torch.device):
    """Rank 0 starts the memory prediction (a child process on a fake process group, while the
    ranks rendezvous and build), every rank joins the process group and gets the prediction
    (None without a budget and a hardware profile); a role over the budget stops every rank here."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    first = int(os.environ.get("RANK", "0")) == 0
    child = start_prediction(cfg, world, device.type, PREDICTION_CHILD) if first else None
    start_flight_recorder(cfg.comm, cfg.job.dump_folder, device.type)
    init_distributed(device, cfg.comm.timeout_seconds)
    predicted = share(child) if wanted(cfg, device.type) else None
    if predicted is not None and first and cfg.memory_estimation.enable:
        for line in estimate_lines(predicted):
            logger.info(line)
    if predicted is not None and predicted.refusal:
        raise MemoryBudgetError("\n".join(predicted.refusal))
    return predicted


def seed_and_determinism(cfg: JobConfig, device: torch.device) -> None:
    torch.manual_seed(cfg.training.seed)
    if cfg.training.deterministic:  # debug.deterministic_warn_only: warn at an op without one
        torch.use_deterministic_algorithms(True, warn_only=cfg.debug.deterministic_warn_only)
        if device.type == "cuda":
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def save_config(cfg: JobConfig, log) -> None:
    """job.save_config_file: the resolved config as TOML in the dump folder (rank 0), which
    --job.config_file reads back to the same config."""
    if not cfg.job.save_config_file or dist.get_rank() != 0:
        return
    path = os.path.join(cfg.job.dump_folder, cfg.job.save_config_file)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        f.write(config_toml(cfg))
    log(f"[torchtitan] config written to {path}")


def job_mesh(cfg: JobConfig, device: torch.device) -> ParallelDims:
    dims = ParallelDims.from_config(cfg, dist.get_world_size())
    dims.build_mesh(device.type, cfg.comm.timeout_seconds)
    return dims


def materialised_parts(
    job: PlannedJob, device: torch.device, *, predicted=None, log=print
) -> ModelParts:
    """This rank's parts, planned (with what the memory budget frees) and parallelized on meta,
    the plan reported, then given memory and their layout-independent initial weights."""
    cfg, dims = job.cfg, job.dims
    pp_rank = dims.pp_rank()
    free = predicted.free_bytes.get(pp_rank, 0) if predicted is not None else 0
    parts = build_parts(
        job,
        pp_rank,
        free_bytes=free,
        budget_note=predicted.budget_note if predicted is not None else "",
    )
    report_plan(
        plan_records(parts),
        dims,
        cfg,
        budget_bytes=predicted.budget_bytes if predicted is not None else None,
        roles=[r.record() for r in predicted.roles] if predicted is not None else None,
        log=log,
        times=[r.time.record() for r in predicted.roles if r.time is not None]
        if predicted is not None
        else None,
    )
    # FSDP2's CPU offload keeps the sharded parameters on the host (its lazy init refuses
    # them elsewhere): materialise there, draw on `device` as every run does (the same
    # weights), and give the buffers (RoPE cache, MoE counters) to the accelerator.
    offload = cfg.training.enable_cpu_offload and device.type != "cpu"
    for part in parts.modules:
        part.to_empty(device=torch.device("cpu") if offload else device)
        part.init_weights(cfg.training.seed, device)
        if offload:
            buffers_to(part, device)
        part.train()
    return parts


def buffers_to(module: torch.nn.Module, device: torch.device) -> None:
    """Every buffer of `module` moved to `device` in place of the old one."""
    for sub in module.modules():
        for name, buf in sub._buffers.items():
            if buf is not None and buf.device != device:
                sub._buffers[name] = buf.to(device)


def run_info(cfg: JobConfig, dims: ParallelDims, tokenizer, args, global_batch: int | None) -> dict:
    """What this run's checkpoint markers record (checkpoint/files.run_record)."""
    m = cfg.model
    return run_record(
        f"{m.name}/{m.flavor}",
        dims.world_size,
        dict(dims.mesh_shape),
        tokenizer.path,
        export_fields(m.name, args),
        model_rules=model_rules(m.name, args),
        global_batch=global_batch,
    )


def hf_spec(cfg: JobConfig, dims: ParallelDims, tokenizer, args) -> HFSpec:
    """Hugging Face import/export facts; the first rank of each pipeline stage writes."""
    m = cfg.model
    export = export_args(m.name, args, flavors_of(m.name)[m.flavor].max_seq_len)
    return HFSpec(
        m.name,
        export,
        tokenizer.bos_id,
        tokenizer.eos_id,
        tokenizer.path,
        dims.leads_stage(),
        dims.pp_rank(),
    )


def write_seed_checkpoint(cfg: JobConfig) -> str:
    """checkpoint.create_seed_checkpoint: the model initialised on this one rank (the checks
    made sure there is one), saved as step-0, weights only; every layout that then trains from
    the folder starts from these weights. Nothing is trained."""
    device = pick_device(cfg.training.device)
    init_distributed(device, cfg.comm.timeout_seconds)
    seed_and_determinism(cfg, device)
    dims = job_mesh(cfg, device)
    tokenizer = load_model_tokenizer(cfg.model)
    job = PlannedJob(cfg, model_on_meta(cfg), dims, device.type)
    parts = materialised_parts(job, device)
    manager = CheckpointManager(
        cfg.checkpoint,
        cfg.job.dump_folder,
        parts.modules,
        run_info(cfg, dims, tokenizer, job.args, job.batch.global_batch),
        io_timeout_seconds=cfg.comm.checkpoint_timeout_seconds,
        device_type=device.type,
    )
    return manager.save_seed()


class Trainer:
    """One rank of a training job, built in the order of the flow in docs/architecture.md."""

    def __init__(self, cfg: JobConfig):
        self.cfg = cfg
        t = cfg.training
        self.device = pick_device(t.device)
        self.predicted = join_job(cfg, self.device)
        self.rank = dist.get_rank()
        self.log_ranks = {int(r) for r in os.environ.get("LOG_RANK", "0").split(",") if r.strip()}
        # early: the CPU peak meter counts the frees of the blocks allocated after it
        self.memory = StepMemoryLog(
            self.device, cfg.metrics.cpu_memory_peak, cfg.job.dump_folder, self.rank
        )
        seed_and_determinism(cfg, self.device)
        self.dims = job_mesh(cfg, self.device)
        self.tokenizer = load_model_tokenizer(cfg.model)
        meta = model_on_meta(cfg)
        if cfg.model.print_after_conversion:
            self.log(f"[torchtitan] model after conversion:\n{meta.model}")
        self.job = PlannedJob(cfg, meta, self.dims, self.device.type)
        # of the whole model, before parallelizing changes it
        self.n_params = sum(p.numel() for p in self.job.model.parameters())
        self.flops_per_token = self.job.model.flops_per_token(t.seq_len)
        self.shape = self.job.batch
        self.comm = CommStats(self.dims.named_groups()) if cfg.metrics.comm_stats else None
        self.parts = materialised_parts(
            self.job, self.device, predicted=self.predicted, log=self.log
        )
        self.model_parts = self.parts.modules
        self.runner = step_runner(
            self.parts,
            self.job,
            self.device,
            doc_delimiter=self.tokenizer.doc_delimiter,
            held_for_backward=cfg.metrics.held_for_backward,
            backward_phase=(lambda: self.comm.phase("backward")) if self.comm else None,
        )
        self.balancer = self._expert_balancer()
        self.tied = tied_copies(self.model_parts, self.dims)
        self.float8_scales = precompute_scales_on(
            cfg.quantize.linear.float8, cfg.model.converters, self.dims.dp_shard
        )
        ft = cfg.fault_tolerance
        # the global batch's rows: under fault tolerance each replica group reads those of its id
        self.data_rank = self.dims.dp_rank() + (ft.replica_id * self.dims.dp if ft.enable else 0)
        self.data_degree = self.dims.dp * replica_groups(cfg)
        self.dataloader = build_dataloader(
            t,
            self.tokenizer,
            self.data_rank,
            self.data_degree,
            self.shape.accum_steps,
            workers=resolve_workers(t.dataloader.num_workers, self.device.type),
            options=loader_options(t.dataloader, self.device.type),
            log=self.log,
        )
        self.validator = (
            Validator(
                cfg,
                self.tokenizer,
                self.data_rank,
                self.data_degree,
                self.shape.accum_steps,
                device_type=self.device.type,
            )
            if cfg.validation.enable
            else None
        )
        self.optimizers = PartOptimizers(
            self.model_parts,
            cfg.optimizer,
            schedule_steps(cfg.lr_scheduler, t.steps),
            cfg.lr_scheduler,
            self.device.type,
        )
        if (split := self.optimizers.split_line()) is not None:
            self.log(split)
        self.train_state = TrainState(self.rank)
        self.watchdog = HangWatchdog(
            hang_timeout(cfg.comm),
            cfg.job.dump_folder,
            self.rank,
            self.dims.world_size,
            self.device,
            watch_compile=cfg.compile.enable,
        )
        self.preemption = Preemption(self.device)
        self.preempted = None  # the closing line of a preempted run
        self.kill_wait_noted, self.held_bytes = False, 0
        self.clock = StepClock(self.watchdog.paused_seconds)  # step time, defined once
        role = self.predicted.role_of(self.rank) if self.predicted is not None else None
        self.time_check = StepTimeCheck(
            role.time.predicted_step_seconds if role is not None and role.time else None
        )
        self.nonfinite = NonFiniteWatch(self.device)
        # semi-synchronous groups differ between syncs: each keeps its own checkpoint, with
        # where it is in the sync period (and DiLoCo's global weights)
        diloco = semi_sync_of(cfg) == "diloco"
        self.semi_state = SemiSyncState(self.model_parts) if diloco else None
        self.checkpoint = CheckpointManager(
            (
                dataclasses.replace(
                    cfg.checkpoint,
                    folder=os.path.join(cfg.checkpoint.folder, f"replica_{ft.replica_id}"),
                )
                if semi_sync_of(cfg)
                else cfg.checkpoint
            ),
            cfg.job.dump_folder,
            self.model_parts,
            run_info(cfg, self.dims, self.tokenizer, self.job.args, self.shape.global_batch),
            optimizers=self.optimizers,
            dataloader=None if ft.enable else self.dataloader,  # each group keeps its own
            train_state=self.train_state,
            io_timeout_seconds=cfg.comm.checkpoint_timeout_seconds,
            hf=hf_spec(cfg, self.dims, self.tokenizer, self.job.args),
            device_type=self.device.type,
            log=self.log,
            hf_assets_path=cfg.model.hf_assets_path,
            extra_states={"semi_sync": self.semi_state} if self.semi_state is not None else None,
        )
        load_note = self.checkpoint.load()
        self.replicas = (
            ReplicaGroups(
                ft,
                model_parts=self.model_parts,
                optimizers=self.optimizers,
                train_state=self.train_state,
                dataloader=self.dataloader,
                positions=(
                    DataPositions(cfg.job.dump_folder, ft.replica_id, self.rank)
                    if cfg.checkpoint.enable_ft_dataloader_checkpoints
                    else None
                ),
                log=self.log,
                paused=self.watchdog.paused,
                semi_state=self.semi_state,
                step_seconds=self.time_check.predicted_s,
            )
            if ft.enable
            else None
        )
        self.metrics = MetricsLogger(
            cfg.job.dump_folder,
            enabled=self.rank == 0,
            tensorboard=cfg.metrics.enable_tensorboard,
            total_steps=t.steps,
            resume_step=self.train_state.step,
            wandb_config=dataclasses.asdict(cfg) if cfg.metrics.enable_wandb else None,
            run_name=cfg.job.description,
            tb_folder=tensorboard_folder(
                cfg.job.dump_folder,
                cfg.metrics.save_tb_folder,
                self.rank,
                cfg.metrics.save_for_all_ranks,
            ),
        )
        self.peak_flops = self._peak_flops()
        save_config(cfg, self.log)
        self._log_header(load_note)

    # ------------------------------------------------------------------ builders

    def _expert_balancer(self) -> ExpertBalancer | None:
        if self.job.args.moe is None:
            return None
        return ExpertBalancer(
            self.model_parts, self.device, self.dims.batch_group(), self.dims.pp_group()
        )

    def _peak_flops(self) -> float | None:
        peak = peak_tflops(self.device, self.cfg.hardware.peak_tflops, self.cfg.hardware.profile)
        if self.device.type == "cuda" and peak is None:
            name = torch.cuda.get_device_name(self.device)
            self.log(f"[torchtitan] MFU n/a: {hardware.unknown_gpu_line(name)}")
        return peak

    # ------------------------------------------------------------------ log lines

    def log(self, msg: str) -> None:
        if self.rank in self.log_ranks:
            logger.info(msg)

    def _log_header(self, load_note: str) -> None:
        cfg, t, shape = self.cfg, self.cfg.training, self.shape
        if cfg.job.print_config:
            for section, values in dataclasses.asdict(cfg).items():
                self.log(f"[{section}] " + ", ".join(f"{k}={v!r}" for k, v in values.items()))
        self.log(
            f"[torchtitan] {cfg.job.description + ': ' if cfg.job.description else ''}"
            f"{cfg.model.name} {cfg.model.flavor}: {self.n_params:,} parameters,"
            f" device {self.device.type}, world {self.dims.world_size}, mesh {dict(self.dims.mesh_shape)},"
            f" params {t.dtype + ' (training.dtype)' if t.dtype != 'float32' else self.parts.param_dtype},"
            f" reduce {t.mixed_precision_reduce}"
        )
        self.log(
            f"[torchtitan] global batch {shape.global_batch} x {t.seq_len} tokens"
            f" ({t.local_batch_size} per rank x {shape.accum_steps} accumulation steps x dp {self.dims.dp}),"
            f" {t.steps} steps, dump folder {cfg.job.dump_folder}"
        )
        for line in self.dataloader.describe():
            self.log(f"[torchtitan] data: {line}")
        if load_note:
            self.log(f"[torchtitan] checkpoint: {load_note}")
        ac, comp = cfg.activation_checkpoint, cfg.compile
        ac_note = ac.mode if ac.mode != "selective" else f"selective ({ac.selective_ac_option})"
        self.log(
            f"[torchtitan] activation checkpointing {ac_note}, compile"
            f" {'on (' + comp.backend + ')' if comp.enable else 'off'}"
            + (", loss parallel" if self.runner.loss_parallel else "")
            + (f"; {self._pipeline_note()}" if self.parts.layout is not None else "")
        )

    def _pipeline_note(self) -> str:
        layout, parts = self.parts.layout, self.parts
        held = ", ".join(f"{sid}: {layout.blocks_note(sid)}" for sid in parts.stage_ids)
        return (
            f"pipeline {self.cfg.parallelism.pipeline_parallel_schedule}: {layout.num_stages} stages"
            f" ({layout.stages_per_rank} per rank), {parts.microbatches} microbatches; rank {self.rank} holds"
            f" stage {held}"
        )

    def _log_memory_error(self, memory: dict) -> None:
        """Predicted vs measured peak of this rank, once (after step 2), so every run reports
        the prediction's error."""
        role = self.predicted.role_of(self.rank) if self.predicted is not None else None
        if role is None:
            return
        predicted = role.predicted_peak_bytes / GIB
        measured = memory.get("memory_peak_allocated_gib")
        text = (
            f"measured {measured:.3f} GiB, error {100 * (predicted - measured) / measured:+.1f}%"
            if measured
            else "measured n/a (on CPU: --metrics.cpu_memory_peak=true)"
        )
        self.log(
            f"[torchtitan] memory, rank {self.rank} (role {role.role}): predicted peak {predicted:.3f} GiB"
            f" (at {role.peak_at}), {text}"
        )

    def _log_step_time_error(self, step: int, measured: float) -> None:
        """Predicted vs measured step time of this rank's role, once, so every run reports the
        step-time model's error (memory/step_time.py)."""
        role = self.predicted.role_of(self.rank)
        predicted = role.time.predicted_step_seconds
        self.log(
            f"[torchtitan] step time, rank {self.rank} (role {role.role}, hardware {self.predicted.hardware}):"
            f" predicted {predicted:.3f}s, measured {measured:.3f}s (mean of the steps up to {step} after the"
            f" first sync point), error {100 * (predicted - measured) / measured:+.1f}%"
        )

    # ------------------------------------------------------------------ one step

    def _mean(self, value: torch.Tensor, pipeline: bool = True) -> float:
        """A rank's sum of scaled loss parts -> the global batch's mean, read on the host (a
        host division: exact on every device, as the figures always were)."""
        pp = self.dims.pp_group() if pipeline and self.runner.pipeline is not None else None
        return global_sum(value, self.dims.loss_group(), pp).item() / self.dims.dp_cp

    def train_step(self, batches, step: int) -> StepResult:
        """One optimizer step over the accumulation steps' micro-batches. Nothing is read on
        the host (on a GPU the host queues the step and goes on): the figures stay on the
        device until `figures` reads them at a sync point, and a non-finite loss or gradient
        norm is noted on the device (training/nonfinite.py)."""
        if self.comm is not None:
            self.comm.phase_name = "forward"  # backward is detected from autograd
        sums = self.runner.forward_backward(batches)
        self.held_bytes = self.runner.held_bytes
        if self.comm is not None:
            self.comm.phase_name = "other"
        return step_tail(  # the simulated step runs the same (planning/simulate/step.py)
            sums,
            step,
            self.model_parts,
            self.optimizers,
            self.cfg.training.max_norm,
            pp_group=self.dims.pp_group() if self.runner.pipeline is not None else None,
            nonfinite=self.nonfinite,
            tied=self.tied,
            balancer=self.balancer,
            float8_scales=self.float8_scales,
            replicas=self.replicas,
        )

    def figures(self, result: StepResult) -> tuple[float, float, dict]:
        """A step's figures reduced over the ranks and read on the host: (global loss, grad
        norm, the MoE balance loss when on, the expert load, the MTP loss when on). Every
        rank calls it at the same steps (it communicates)."""
        loss = self._mean(result.sums.main)
        grad_norm = result.grad_norm.item()
        figures = self.balancer.figures(result.load) if self.balancer is not None else {}
        if self.job.args.moe is not None and self.job.args.moe.aux_loss_coeff > 0:
            figures["aux_loss"] = self._mean(result.sums.aux)  # under PP the last stage's
        if self.runner.mtp_depth:  # reduced as the loss: a per-rank mean, averaged over the ranks
            figures["mtp_loss"] = self._mean(result.sums.mtp)
        return loss, grad_norm, figures

    def _run_validation(self, step: int) -> None:
        start = time.perf_counter()
        for m in self.model_parts:
            m.eval()  # e.g. MoE layers do not count tokens for load balancing
        try:
            with self.watchdog.paused(f"validation after step {step}"):
                values = self.validator.measure(
                    lambda batches: self._mean(self.runner.evaluate(batches))
                )
        finally:
            for m in self.model_parts:
                m.train()
                m.zero_grad(set_to_none=True)  # V schedules validate with a backward
            reshard_after_eval(self.model_parts)
        self.metrics.log_validation(
            step, values, self.cfg.validation.steps, time.perf_counter() - start
        )

    # ------------------------------------------------------------------ the loop

    def train(self) -> None:
        t = self.cfg.training
        profiler = Profiler(
            self.cfg.profiling,
            self.cfg.job.dump_folder,
            self.rank,
            self.device,
            start_step=self.train_state.step,
            last_step=self.cfg.training.steps,
            log=self.log,
        )
        self.garbage = GarbageSchedule(t.gc_freq, t.gc_debug, log=self.log)
        # self.metrics last in: closed first, failed (W&B run marked so) when the loop raises;
        # the preemption handlers are on for the loop only (preemption.py)
        with (
            self.comm if self.comm is not None else contextlib.nullcontext(),
            profiler,
            self.garbage,
            self.memory,
            self.metrics,
            self.preemption,
        ):
            self.watchdog.start()
            try:
                self._train_loop(profiler)
            finally:
                self.watchdog.close()
            self.preemption.drain()
            self.metrics.preempted = self.preempted is not None
        self.checkpoint.close()
        if self.replicas is not None:
            self.replicas.close()
        if self.preempted is None:
            self.log(f"[torchtitan] training done: {self.cfg.training.steps} steps")

    def _train_loop(self, profiler: Profiler) -> None:
        t = self.cfg.training
        data = iter(self.dataloader)
        start_step = self.train_state.step
        if self.validator is not None and self.validator.due(0, t.steps, start_step):
            self._run_validation(0)
        while self.train_state.step < t.steps:
            if self.replicas is not None and self.replicas.begin_step():
                data = iter(self.dataloader)  # healed: this group's data position of the step
                if self.train_state.step >= t.steps:
                    break
            step = self.train_state.step + 1
            self.clock.begin()
            self.watchdog.progress(f"step {step}: data")
            faults.point("data", step)
            batches = [next(data) for _ in range(self.shape.accum_steps)]
            lr = self.optimizers.last_lr()
            self.memory.begin()
            if self.comm is not None:
                self.comm.reset()  # drop what ran between steps (e.g. checkpoint saves)
            self.watchdog.progress(f"step {step}: forward/backward")
            faults.point("step", step)
            with profiler.step(step):
                result = self.train_step(batches, step)
            memory = self.memory.end(step)
            if not result.committed:  # a replica group was lost during it: trained again
                self.clock.end(synced=False)
                self.log(
                    f"[torchtitan] fault tolerance: step {step} not committed (a replica group"
                    " failed during it); trained again with the next batches"
                )
                continue
            self.watchdog.progress(f"step {step}: metrics")
            if self.replicas is not None:  # semi-synchronous: a heal in the sync moved it
                step = self.replicas.step_number(step)
            self.train_state.step = step
            tokens = self.shape.global_batch * t.seq_len
            comm = self._comm_figures()
            if self.replicas is not None:  # the groups that took part; this group's data position
                tokens = self.replicas.tokens_of_step(tokens)
                comm["replica_groups"] = self.replicas.participants
                self.replicas.after_step(step, self.checkpoint.due(step, step == t.steps))
            self.train_state.tokens_seen += tokens
            if self._sync_point(step, start_step):
                self.nonfinite.check()  # before anything is logged, validated or saved
                loss, grad_norm, figures = self.figures(result)
                step_s = self.clock.end(synced=True)
                measured = self.time_check.at_sync(self.clock)
                if measured is not None:
                    self._log_step_time_error(step, measured)
                self.watchdog.step_time(self.clock.longest_step_s)
                if self._logs(step):
                    self._log_step(
                        step,
                        step_s,
                        loss,
                        grad_norm,
                        lr,
                        memory=memory,
                        figures={**figures, **comm},
                    )
            else:
                self.clock.end(synced=False)
            if step == start_step + 1:
                self.watchdog.arm()  # the first step (set-up, compilation) may take longer
                if self.cfg.comm.train_timeout_seconds != "auto":
                    seconds = self.cfg.comm.train_timeout_seconds
                    groups = set_collective_timeout(seconds)
                    self.log(
                        f"[torchtitan] collective timeout from step {step + 1} on: {seconds} s"
                        f" on {groups} process groups (comm.train_timeout_seconds)"
                    )
                if self.cfg.compile.enable:
                    for line in compile_log_lines():
                        self.log(line)
            if step == start_step + 2:
                self._log_memory_error(memory)
            self.garbage.after_step(step)  # every rank at the same steps (training.gc_freq)
            if self._between_steps(step, start_step):
                return

    def _logs(self, step: int) -> bool:
        return step % self.cfg.metrics.log_freq == 0 or step == self.cfg.training.steps

    def _sync_point(self, step: int, start_step: int) -> bool:
        """Where the host waits for the device: the steps that log, and those after which a
        checkpoint is saved or the model validated (which must not see a non-finite step)."""
        t = self.cfg.training
        return (
            self._logs(step)
            or self.checkpoint.due(step, last=step == t.steps)
            or (self.validator is not None and self.validator.due(step, t.steps, start_step))
        )

    def _comm_figures(self) -> dict:
        if self.comm is None:
            return {}
        counts, nbytes = self.comm.reset()
        return {"comm": counts, "comm_bytes": nbytes}

    def _log_step(
        self,
        step: int,
        step_time: float,
        loss: float,
        grad_norm: float,
        lr: float,
        *,
        memory: dict,
        figures: dict,
    ) -> None:
        """step_time: observe/step_clock.py's (the mean over the steps since the last sync point)."""
        t = self.cfg.training
        tps = self.shape.global_batch * t.seq_len / step_time
        per_device = tps / (self.dims.world_size * replica_groups(self.cfg))  # every group's
        mfu = (
            per_device * self.flops_per_token / (self.peak_flops * 1e12)
            if self.peak_flops
            else None
        )
        self.metrics.log(
            step,
            {
                "loss": loss,
                "grad_norm": grad_norm,
                "lr": lr,
                "tokens_per_sec": tps,
                "tokens_per_sec_per_device": per_device,
                "mfu": mfu,
                **memory,
                "step_time": step_time,
                "tokens_seen": self.train_state.tokens_seen,
                **self._tokens_by_source(step),
                **figures,
                **(
                    {"held_for_backward_bytes": self.held_bytes}
                    if self.cfg.metrics.held_for_backward
                    else {}
                ),
            },
        )

    def _tokens_by_source(self, step: int) -> dict:
        """tokens_seen/<source> of a mixture: the job's, from the mixture's pattern (no communication)."""
        windows = self.dataloader.windows_by_source(step)
        return {f"tokens_seen/{name}": n * self.cfg.training.seq_len for name, n in windows.items()}

    def _between_steps(self, step: int, start_step: int) -> bool:
        """Validation, checkpoint, and the ranks' agreement on a preemption signal; True when
        the run stops here (preempted: the step is checkpointed)."""
        t = self.cfg.training
        if self.validator is not None and self.validator.due(step, t.steps, start_step):
            self._run_validation(step)
        with self.watchdog.paused(f"the checkpoint save after step {step}"):
            if self.replicas is None or self.replicas.writes_checkpoints:  # one group writes
                self.checkpoint.maybe_save(step, last=step == t.steps)
        if step == t.steps:
            return False  # finished: a late signal has nothing left to stop
        note = (
            kill_wait_note(self.checkpoint.save_estimate(), self.clock.last_step_s)
            if self.cfg.checkpoint.enable
            else None
        )
        if note is not None and not self.kill_wait_noted:  # once
            self.kill_wait_noted = True
            self.log(f"[torchtitan] {note}")
        self.watchdog.progress(f"step {step}: preemption check")
        stop = self.preemption.agree()
        if stop is None:
            return False
        self.nonfinite.check()  # a preemption save is a sync point too
        with self.watchdog.paused(f"the preemption save after step {step}"):
            # fault tolerance: a group preempted alone leaves the saving to the lowest group
            writes = self.replicas is None or self.replicas.writes_checkpoints
            saved = self.checkpoint.save_now(step) if writes else None
        save_s = saved[1] if saved is not None else 0.0
        self.preempted = stop_line(
            stop,
            step,
            saved[0] if saved is not None else None,
            save_s,
            stop.since_signal_s + save_s,
            **(
                {}
                if writes or not self.cfg.checkpoint.enable
                else {"not_saved": "the lowest live replica group writes the checkpoints"}
            ),
        )
        self.log(f"[torchtitan] {self.preempted}")
        return True


def _error_line(text: str) -> None:
    """One write to stderr, so the lines of ranks failing at once do not interleave."""
    sys.stdout.flush()
    os.write(2, (text + "\n").encode())


def main(argv: list[str] | None = None) -> int:
    log.setup()
    argv = sys.argv[1:] if argv is None else argv
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    cfg = load_config_or_exit(argv, world_size, quiet=int(os.environ.get("RANK", "0")) != 0)
    if "RANK" not in os.environ:  # plain `python -m torchtitan.train`: a 1-process job
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29571")
    trainer = None
    try:
        if cfg.checkpoint.create_seed_checkpoint:
            path = write_seed_checkpoint(cfg)
            if dist.get_rank() == 0:
                logger.info(
                    f"[torchtitan] seed checkpoint written to {path}; train any layout from this folder"
                )
        else:
            trainer = Trainer(cfg)
            trainer.train()
    except DeviceError as e:  # before any process group, alike on every rank of the node
        _error_line(f"error: {e}")
        return 2
    except MemoryBudgetError as e:  # decided on rank 0 and shared: alike on every rank
        if int(os.environ.get("RANK", "0")) == 0:
            for line in str(e).splitlines():
                _error_line(f"error: {line}")
        shutdown_distributed()
        return 2
    except (NonFiniteLossError, CheckpointError, HFExportError) as e:  # raised alike on every rank
        _error_line(f"error: {e}")
        if trainer is not None:
            trainer.checkpoint.settle()
        shutdown_distributed()
        return 1
    except (
        DataError
    ) as e:  # a bad document on this rank's rows only: the others wait in a collective
        _error_line(f"error: rank {os.environ.get('RANK')}: {e}")
        os._exit(1)  # torchrun then stops the other ranks
    # broad, then re-raised: only a communication failure is handled here (DCP's
    # CheckpointException is a BaseException); anything else keeps its traceback
    except (Exception, CheckpointException) as e:
        if not is_comm_failure(e):
            raise
        # A peer died or hung: the group is unusable, so tearing it down could hang too.
        watchdog = getattr(trainer, "watchdog", None)
        if watchdog is not None:
            watchdog.wait_for_report()  # a hang report in progress ends the process itself
        activity = watchdog.activity if watchdog is not None else "start-up"
        _error_line(
            f"error: rank {os.environ.get('RANK')}: communication failed during {activity}"
            f" ({comm_failure_summary(e)}); another rank died or stalled past --comm.timeout_seconds="
            f"{cfg.comm.timeout_seconds}; rerun the same command to resume from the last checkpoint"
        )
        os._exit(1)
    shutdown_distributed()
    if trainer is not None and trainer.preempted is not None:
        if int(os.environ.get("LOCAL_RANK", "0")) == 0:  # one status file per node (run_train.sh)
            exit_status.record(exit_status.EXIT_PREEMPTED, trainer.preempted)
        return exit_status.preempted_exit_code()
    return 0


if __name__ == "__main__":
    sys.exit(main())
