"""The trainer: config -> mesh -> model on meta -> parallelize -> materialise -> train loop.

Launched by run_train.sh as `torchrun ... -m torchtitan.train --job.config_file X [overrides]`.
"""

import contextlib
import dataclasses
import math
import os
import sys
import time
import warnings

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from torchtitan.components.checkpoint import CheckpointManager, TrainState
from torchtitan.components.checkpoint_files import CheckpointError
from torchtitan.components.dataloader import build_dataloader
from torchtitan.components.datasets import DataError
from torchtitan.components import exit_status, faults
from torchtitan.components.expert_balance import ExpertBalancer
from torchtitan.components.hang_watchdog import HangWatchdog
from torchtitan.components.hf_weights import HFExportError, HFSpec
from torchtitan.components.metrics import MetricsLogger, StepMemory, peak_tflops
from torchtitan.components.optimizer import PartOptimizers
from torchtitan.components.preemption import Preemption, kill_wait_note, stop_line
from torchtitan.components.profiling import Profiler
from torchtitan.components.tokenizer import Tokenizer
from torchtitan.components.train_step import PipelineLoss, StepRunner, cross_entropy_loss, local_value
from torchtitan.components.validation import Validator
from torchtitan.config import JobConfig, load_config_or_exit
from torchtitan.distributed.parallel_dims import ParallelDims
from torchtitan.distributed.comm_stats import CommStats
from torchtitan.distributed.data_parallel import reshard_after_eval
from torchtitan.distributed.job_shape import batch_shape
from torchtitan.distributed.model_parts import ModelParts, build_parts, plan_records
from torchtitan.distributed.plan_report import compress_table, plan_table, write_plan_json
from torchtitan.distributed.pipeline_parallel import build_pipeline
from torchtitan.distributed.tensor_parallel import loss_parallel_context
from torchtitan.distributed.utils import (
    DeviceError, clip_grad_norm_, comm_failure_summary, init_distributed, is_comm_failure, pick_device,
    shutdown_distributed,
)
from torchtitan.memory.startup import MemoryBudgetError, share, start_prediction
from torchtitan.models.flavors import MODEL_FLAVORS
from torchtitan.models.hf_converters import export_args, export_fields, model_rules
from torchtitan.protocols.train_spec import get_train_spec, model_args

warnings.filterwarnings("ignore", message=".*set_vital.*")


class NonFiniteLossError(RuntimeError):
    pass


class Trainer:
    def __init__(self, cfg: JobConfig, argv: list[str] | None = None):
        self.cfg = cfg
        t = cfg.training
        self.device = pick_device(t.device)
        world = int(os.environ.get("WORLD_SIZE", "1"))
        # rank 0 predicts every role's peak (a child process on a fake process group) while the
        # ranks join and build; every rank gets it before it parallelizes (the plan may use it)
        first = int(os.environ.get("RANK", "0")) == 0
        child = start_prediction(argv or [], cfg, world, self.device.type) if first else None
        init_distributed(self.device, cfg.comm.timeout_seconds)
        self.rank, world = dist.get_rank(), dist.get_world_size()
        self.predicted = share(child) if cfg.parallelism.memory_budget_gib != -1 else None
        if self.predicted is not None and self.predicted.refusal:
            raise MemoryBudgetError("\n".join(self.predicted.refusal))
        self.log_ranks = {int(r) for r in os.environ.get("LOG_RANK", "0").split(",") if r.strip()}
        self.memory = StepMemory(self.device, cfg.metrics.cpu_memory_peak, cfg.job.dump_folder, self.rank)
        torch.manual_seed(t.seed)
        if t.deterministic:
            torch.use_deterministic_algorithms(True)
            if self.device.type == "cuda":
                os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

        self.dims = ParallelDims.from_config(cfg, world)
        self.mesh = self.dims.build_mesh(self.device.type, cfg.comm.timeout_seconds)

        self.tokenizer = Tokenizer(cfg.model.tokenizer_path)
        spec = get_train_spec(cfg.model.name)
        self.model_args = model_args(cfg.model.name, cfg.model.flavor, self.tokenizer.vocab_size, t.seq_len, cfg.moe,
                                     mtp_depth=cfg.model.mtp_depth, initial_load_path=cfg.checkpoint.initial_load_path)
        with torch.device("meta"):
            model = spec.model_cls(self.model_args)
        self.n_params = sum(p.numel() for p in model.parameters())
        self.flops_per_token = model.flops_per_token(t.seq_len)

        shape = batch_shape(cfg, self.dims.dp)
        self.global_batch, self.accum_steps = shape.global_batch, shape.accum_steps
        self.pipeline = self.layout = None
        self.layout_note = ""
        self.held_bytes = 0
        self.comm = CommStats(self.dims.named_groups()) if cfg.metrics.comm_stats else None
        pp_rank = self.dims.pp_rank()
        free = self.predicted.free_bytes.get(pp_rank, 0) if self.predicted is not None else 0
        parts = build_parts(spec, model, self.dims, cfg, self.device.type, pp_rank, free,
                            self.predicted.budget_note if self.predicted is not None else "")
        self.param_dtype = parts.param_dtype
        self._report_plan(parts)
        for part in parts.modules:
            part.to_empty(device=self.device)
            part.init_weights(t.seed, self.device)
            part.train()
        self.model_parts = parts.modules
        self.stage_ids = parts.stage_ids
        if parts.layout is not None:
            layout, n_mb = parts.layout, parts.microbatches
            self.layout = layout
            scale = n_mb * self.accum_steps
            self.pipeline = build_pipeline(
                list(zip(parts.stage_ids, parts.modules)), layout, self.device, self.dims.pp_group(), n_mb,
                loss_fn=PipelineLoss(scale, cfg.model.mtp_depth, t.mtp_loss_weight, t.seq_len,
                                     cfg.parallelism.context_parallel_degree),
                backward_phase=(lambda: self.comm.phase("backward")) if self.comm is not None else None,
            )
            held = ", ".join(f"{sid}: layers {layout.stages[sid][0]}-{layout.stages[sid][-1]}" for sid in parts.stage_ids)
            self.layout_note = (
                f"pipeline {cfg.parallelism.pipeline_parallel_schedule}: {layout.num_stages} stages"
                f" ({layout.stages_per_rank} per rank), {n_mb} microbatches; rank {self.rank} holds stage {held}"
            )
        self.loss_parallel = self.dims.tp > 1 and cfg.parallelism.loss_parallel
        self.runner = StepRunner(self.model_parts, self.device, self.accum_steps, self.loss_parallel, self.pipeline,
                                 self.layout, self.stage_ids, cfg.metrics.held_for_backward,
                                 bos_id=self.tokenizer.bos_id if cfg.model.attn_mask == "block_causal" else None,
                                 cp=self.model_parts[0].context_parallel,
                                 mtp_depth=cfg.model.mtp_depth, mtp_loss_weight=t.mtp_loss_weight)

        self.balancer = None
        self.model_args_aux_loss = getattr(self.model_args, "aux_loss_coeff", 0.0) > 0
        if getattr(self.model_args, "n_routed_experts", 0):
            self.balancer = ExpertBalancer(self.model_parts, self.device, self.dims.batch_group(), self.dims.pp_group())
        self.dataloader = build_dataloader(t, self.tokenizer, self.dims.dp_rank(), self.dims.dp, self.accum_steps)
        self.validator = (Validator(cfg, self.tokenizer, self.dims.dp_rank(), self.dims.dp, self.accum_steps)
                          if cfg.validation.enable else None)
        self.optimizers = PartOptimizers(self.model_parts, cfg.optimizer, self.device.type, t.steps, cfg.lr_scheduler)
        self.train_state = TrainState(self.rank)
        self.watchdog = HangWatchdog(cfg.comm.resolved_hang_timeout(), cfg.job.dump_folder, self.rank, world,
                                     self.device, watch_compile=cfg.compile.enable)
        self.preemption = Preemption(self.device)
        self.preempted = None  # the closing line of a preempted run
        self.last_step_s, self.kill_wait_noted = 0.0, False
        self.checkpoint = CheckpointManager(
            cfg.checkpoint, cfg.job.dump_folder, self.model_parts, self.optimizers, self.dataloader,
            self.train_state, {"world_size": world, "global_batch": self.global_batch,
                               "model": f"{cfg.model.name}/{cfg.model.flavor}", "mesh": dict(self.dims.mesh_shape),
                               "tokenizer": os.path.abspath(self.tokenizer.path),
                               "hf_args": export_fields(cfg.model.name, self.model_args),
                               "model_rules": model_rules(cfg.model.name, self.model_args)},
            io_timeout_seconds=cfg.comm.checkpoint_timeout_seconds, hf=self._hf_spec(pp_rank),
            device_type=self.device.type, log=self.log,
        )
        if cfg.checkpoint.create_seed_checkpoint:
            return  # train() writes the seed checkpoint and stops
        load_note = self.checkpoint.load()
        self.metrics = MetricsLogger(
            cfg.job.dump_folder, enabled=self.rank == 0, tensorboard=cfg.metrics.enable_tensorboard,
            total_steps=t.steps, resume_step=self.train_state.step,
            wandb_config=dataclasses.asdict(cfg) if cfg.metrics.enable_wandb else None, run_name=cfg.job.description,
        )
        self.peak_flops = peak_tflops(self.device, cfg.metrics.peak_tflops)
        if self.device.type == "cuda" and self.peak_flops is None:
            self.log(f"[torchtitan] MFU n/a: no peak TFLOPS known for '{torch.cuda.get_device_name(self.device)}';"
                     " set --metrics.peak_tflops (dense bf16) to get it")
        self._log_header(load_note)

    def _hf_spec(self, pp_rank: int) -> HFSpec:
        """Hugging Face import/export facts; the first rank of each pipeline stage writes."""
        m = self.cfg.model
        writes = self.dims.leads_stage()
        args = export_args(m.name, self.model_args, MODEL_FLAVORS[m.name][m.flavor].max_seq_len)
        return HFSpec(m.name, args, self.tokenizer.bos_id, self.tokenizer.eos_id, self.tokenizer.path, writes, pp_rank)

    def _report_plan(self, parts: ModelParts) -> None:
        """Every pipeline rank's plan -> rank 0 prints the table and writes plan.json."""
        records = plan_records(parts)
        if self.dims.pp > 1:
            gathered = [None] * self.dims.pp
            dist.all_gather_object(gathered, records, group=self.dims.pp_group())
            records = [r for rank_records in gathered for r in rank_records]
        if self.rank == 0:
            p = self.cfg.parallelism
            path = write_plan_json(
                self.cfg.job.dump_folder, self.dims.world_size, self.dims.mesh_shape, records,
                {"reshard_after_forward": p.reshard_after_forward,
                 "memory_budget_bytes": self.predicted.budget_bytes if self.predicted is not None else None,
                 "memory_per_rank_role": ([r.record() for r in self.predicted.roles]
                                          if self.predicted is not None else None)},
            )
            self.log(f"[torchtitan] FSDP plan (reshard_after_forward={p.reshard_after_forward}), written to {path}:\n"
                     + compress_table(plan_table(records)))

    def _log_memory_error(self, memory: dict) -> None:
        """Predicted vs measured peak of this rank, once (after step 2), so every run reports
        the prediction's error."""
        role = self.predicted.role_of(self.rank) if self.predicted is not None else None
        if role is None:
            return
        predicted = role.predicted_peak_bytes / 2**30
        measured = memory.get("memory_peak_allocated_gib")
        text = (f"measured {measured:.3f} GiB, error {100 * (predicted - measured) / measured:+.1f}%" if measured
                else "measured n/a (on CPU: --metrics.cpu_memory_peak=true)")
        self.log(f"[torchtitan] memory, rank {self.rank} (role {role.role}): predicted peak {predicted:.3f} GiB"
                 f" (at {role.peak_at}), {text}")

    def log(self, msg: str) -> None:
        if self.rank in self.log_ranks:
            print(msg, flush=True)

    def _log_header(self, load_note: str) -> None:
        t = self.cfg.training
        if self.cfg.job.print_config:
            for section, values in dataclasses.asdict(self.cfg).items():
                self.log(f"[{section}] " + ", ".join(f"{k}={v!r}" for k, v in values.items()))
        self.log(
            f"[torchtitan] {self.cfg.job.description + ': ' if self.cfg.job.description else ''}"
            f"{self.cfg.model.name} {self.cfg.model.flavor}: {self.n_params:,} parameters,"
            f" device {self.device.type}, world {self.dims.world_size}, mesh {dict(self.dims.mesh_shape)},"
            f" params {self.param_dtype}, reduce {t.mixed_precision_reduce}"
        )
        self.log(
            f"[torchtitan] global batch {self.global_batch} x {t.seq_len} tokens"
            f" ({t.local_batch_size} per rank x {self.accum_steps} accumulation steps x dp {self.dims.dp}),"
            f" {t.steps} steps, dump folder {self.cfg.job.dump_folder}"
        )
        if load_note:
            self.log(f"[torchtitan] checkpoint: {load_note}")
        ac, comp = self.cfg.activation_checkpoint, self.cfg.compile
        ac_note = ac.mode if ac.mode != "selective" else f"selective ({ac.selective_ac_option})"
        self.log(
            f"[torchtitan] activation checkpointing {ac_note}, compile"
            f" {'on (' + comp.backend + ')' if comp.enable else 'off'}"
            + (", loss parallel" if self.loss_parallel else "")
            + (f"; {self.layout_note}" if self.layout_note else "")
        )

    def train_step(self, batches) -> tuple[float, float, dict]:
        """One optimizer step over `accum_steps` micro-batches; returns (global loss, grad norm,
        extra figures: the MoE balance loss when on, the expert load, the MTP loss when on)."""
        if self.comm is not None:
            self.comm.phase_name = "forward"  # backward is detected from autograd
        loss_sum, aux_sum, mtp_sum = self.runner.forward_backward(batches)
        self.held_bytes = self.runner.held_bytes
        if self.comm is not None:
            self.comm.phase_name = "other"
        pp_group = self.dims.pp_group() if self.pipeline is not None else None
        params = [p for m in self.model_parts for p in m.parameters()]
        grad_norm = clip_grad_norm_(params, self.cfg.training.max_norm, pp_group).item()
        loss = self._global_loss(loss_sum)
        # Checked before the update, so a bad step never reaches the weights (or a checkpoint).
        for what, value in (("loss", loss), ("gradient norm", grad_norm)):
            if not math.isfinite(value):
                raise NonFiniteLossError(
                    f"{what} is {value} at step {self.train_state.step + 1}: training stopped; lower"
                    " --optimizer.lr or set --training.max_norm, then resume from the last checkpoint"
                )
        self.optimizers.step()
        moe = self.balancer.step() if self.balancer is not None else {}
        if self.model_args_aux_loss:
            dist.all_reduce(aux_sum, group=self.dims.loss_group())
            moe["aux_loss"] = aux_sum.item() / self.dims.dp_cp
        if self.runner.mtp_depth:  # reduced as the loss: a per-rank mean, averaged over the ranks
            moe["mtp_loss"] = self._global_loss(mtp_sum)
        return loss, grad_norm, moe

    def _global_loss(self, loss_sum: torch.Tensor) -> float:
        """This rank's sum of scaled micro-batch losses -> the mean over the global batch."""
        if self.pipeline is not None:  # only the last stage computed a loss; the others add 0
            dist.all_reduce(loss_sum, group=self.dims.pp_group())
        dist.all_reduce(loss_sum, op=dist.ReduceOp.SUM, group=self.dims.loss_group())
        return loss_sum.item() / self.dims.dp_cp

    @torch.no_grad()
    def eval_step(self, batches) -> float:
        """train_step's loss of one global batch without backward or update (validation)."""
        loss_sum = torch.zeros((), device=self.device)
        with loss_parallel_context(self.loss_parallel):
            for inputs, labels in batches:
                inputs, labels, kwargs = self.runner.prepare(inputs, labels, mtp=False)  # the main loss only
                if self.pipeline is not None:
                    loss_sum += self.runner.pipeline_losses(inputs, labels, train=False, kwargs=kwargs)
                    continue
                logits = self.model_parts[0](inputs, **kwargs)
                loss_sum += local_value(cross_entropy_loss(logits, labels) / self.accum_steps)
        return self._global_loss(loss_sum)

    def _validate(self, step: int) -> None:
        start = time.perf_counter()
        for m in self.model_parts:
            m.eval()  # e.g. MoE layers do not count tokens for load balancing
        try:
            with self.watchdog.paused(f"validation after step {step}"):
                values = self.validator.measure(self.eval_step)
        finally:
            for m in self.model_parts:
                m.train()
                m.zero_grad(set_to_none=True)  # V schedules validate with a backward
            reshard_after_eval(self.model_parts)
        self.metrics.log_validation(step, values, self.cfg.validation.steps, time.perf_counter() - start)

    def train(self) -> None:
        if self.cfg.checkpoint.create_seed_checkpoint:
            path = self.checkpoint.save_seed()
            self.log(f"[torchtitan] seed checkpoint written to {path}; train any layout from this folder")
            return
        profiler = Profiler(self.cfg.profiling, self.cfg.job.dump_folder, self.rank, self.device,
                            self.train_state.step, self.cfg.training.steps, self.log)
        # self.metrics last in: closed first, failed (W&B run marked so) when the loop raises;
        # the preemption handlers are on for the loop only (preemption.py)
        with self.comm if self.comm is not None else contextlib.nullcontext(), profiler, self.memory, self.metrics, \
                self.preemption:
            self.watchdog.start()
            try:
                self._train_loop(profiler)
            finally:
                self.watchdog.close()
            self.preemption.drain()
            self.metrics.preempted = self.preempted is not None
        self.checkpoint.close()
        if self.preempted is None:
            self.log(f"[torchtitan] training done: {self.cfg.training.steps} steps")

    def _train_loop(self, profiler: Profiler) -> None:
        t = self.cfg.training
        data = iter(self.dataloader)
        start_step = self.train_state.step
        if self.validator is not None and self.validator.due(0, t.steps, start_step):
            self._validate(0)
        while self.train_state.step < t.steps:
            step = self.train_state.step + 1
            start = time.perf_counter()
            self.watchdog.step_began()
            self.watchdog.progress(f"step {step}: data")
            faults.point("data", step)
            batches = [next(data) for _ in range(self.accum_steps)]
            lr = self.optimizers.last_lr()
            self.memory.begin()
            if self.comm is not None:
                self.comm.reset()  # drop what ran between steps (e.g. checkpoint saves)
            self.watchdog.progress(f"step {step}: forward/backward")
            faults.point("step", step)
            with profiler.step(step):
                loss, grad_norm, moe = self.train_step(batches)
            memory = self.memory.end(step)
            self.watchdog.progress(f"step {step}: metrics")
            self.train_state.step = step
            self.train_state.tokens_seen += self.global_batch * t.seq_len
            self.last_step_s = time.perf_counter() - start
            self._log_step(step, self.last_step_s, loss, grad_norm, lr, memory, moe)
            self.watchdog.step_ended()
            if step == start_step + 1:
                self.watchdog.arm()  # the first step (set-up, compilation) may take longer
            if step == start_step + 2:
                self._log_memory_error(memory)
            if self._between_steps(step, start_step):
                return

    def _log_step(self, step: int, step_time: float, loss: float, grad_norm: float, lr: float, memory: dict,
                  moe: dict) -> None:
        t = self.cfg.training
        comm = {}
        if self.comm is not None:
            counts, nbytes = self.comm.reset()
            comm = {"comm": counts, "comm_bytes": nbytes}
        if step % self.cfg.metrics.log_freq != 0 and step != t.steps:
            return
        tps = self.global_batch * t.seq_len / step_time
        per_device = tps / self.dims.world_size
        mfu = per_device * self.flops_per_token / (self.peak_flops * 1e12) if self.peak_flops else None
        self.metrics.log(step, {
            "loss": loss, "grad_norm": grad_norm, "lr": lr, "tokens_per_sec": tps,
            "tokens_per_sec_per_device": per_device, "mfu": mfu, **memory, "step_time": step_time,
            "tokens_seen": self.train_state.tokens_seen, **moe, **comm,
            **({"held_for_backward_bytes": self.held_bytes} if self.cfg.metrics.held_for_backward else {}),
        })

    def _between_steps(self, step: int, start_step: int) -> bool:
        """Validation, checkpoint, and the ranks' agreement on a preemption signal; True when
        the run stops here (preempted: the step is checkpointed)."""
        t = self.cfg.training
        if self.validator is not None and self.validator.due(step, t.steps, start_step):
            self._validate(step)
        with self.watchdog.paused(f"the checkpoint save after step {step}"):
            self.checkpoint.maybe_save(step, last=step == t.steps)
        if step == t.steps:
            return False  # finished: a late signal has nothing left to stop
        note = kill_wait_note(self.checkpoint.save_estimate(), self.last_step_s) if self.cfg.checkpoint.enable else None
        if note is not None and not self.kill_wait_noted:  # once
            self.kill_wait_noted = True
            self.log(f"[torchtitan] {note}")
        self.watchdog.progress(f"step {step}: preemption check")
        stop = self.preemption.agree()
        if stop is None:
            return False
        with self.watchdog.paused(f"the preemption save after step {step}"):
            saved = self.checkpoint.save_now(step)
        save_s = saved[1] if saved is not None else 0.0
        self.preempted = stop_line(stop, step, saved[0] if saved is not None else None, save_s,
                                   stop.since_signal_s + save_s)
        self.log(f"[torchtitan] {self.preempted}")
        return True


def _error_line(text: str) -> None:
    """One write to stderr, so the lines of ranks failing at once do not interleave."""
    sys.stdout.flush()
    os.write(2, (text + "\n").encode())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    cfg = load_config_or_exit(argv, world_size, quiet=int(os.environ.get("RANK", "0")) != 0)
    if "RANK" not in os.environ:  # plain `python -m torchtitan.train`: a 1-process job
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29571")
    trainer = None
    try:
        trainer = Trainer(cfg, argv)
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
    except DataError as e:  # a bad document on this rank's rows only: the others wait in a collective
        _error_line(f"error: rank {os.environ.get('RANK')}: {e}")
        os._exit(1)  # torchrun then stops the other ranks
    except (Exception, CheckpointException) as e:  # DCP's CheckpointException is a BaseException
        if not is_comm_failure(e):
            raise
        # A peer died or hung: the group is unusable, so tearing it down could hang too.
        watchdog = getattr(trainer, "watchdog", None)
        if watchdog is not None:
            watchdog.wait_for_report()  # a hang report in progress ends the process itself
        activity = watchdog.activity if watchdog is not None else "start-up"
        _error_line(f"error: rank {os.environ.get('RANK')}: communication failed during {activity}"
                    f" ({comm_failure_summary(e)}); another rank died or stalled past --comm.timeout_seconds="
                    f"{cfg.comm.timeout_seconds}; rerun the same command to resume from the last checkpoint")
        os._exit(1)
    shutdown_distributed()
    if trainer is not None and trainer.preempted is not None:
        if int(os.environ.get("LOCAL_RANK", "0")) == 0:  # one status file per node (run_train.sh)
            exit_status.record(exit_status.EXIT_PREEMPTED, trainer.preempted)
        return exit_status.preempted_exit_code()
    return 0


if __name__ == "__main__":
    sys.exit(main())
