"""Per-step metrics: the console line (with ETA), metrics.jsonl, and the numeric values as
scalars to TensorBoard and (--metrics.enable_wandb) Weights & Biases.

Only the logging rank writes these files (TensorBoard's: every rank with
metrics.save_for_all_ranks, each in its own folder). metrics.jsonl holds one JSON object per logged step;
scripts/plot_loss.py and the tests read its keys (step, loss, grad_norm, lr, tokens_per_sec).
Every rank writes its own memory peak per step (StepMemoryLog: memory/rank<r>.jsonl).
"""

import json
import logging
import os
import time

import torch

from torchtitan import hardware
from torchtitan.observe.cpu_memory import CpuPeakMeter
from torchtitan.resilience.exit_status import EXIT_PREEMPTED
from torchtitan.units import GIB

logger = logging.getLogger(__name__)


def peak_tflops(
    device: torch.device, configured: float | str, profile: str = "auto"
) -> float | None:
    """The dense bf16 peak TFLOPS the measured MFU divides by: --hardware.peak_tflops, or
    ("auto") the figure of the hardware table (torchtitan/hardware.py, the entry the predicted
    MFU divides by): --hardware.profile's, or (auto) the one the GPU's exact name chooses. None
    on CPU or for a GPU the table does not hold (no MFU then: hardware.unknown_gpu_line)."""
    if configured != "auto":
        return configured
    if device.type != "cuda":
        return None
    return hardware.measured_peak_tflops(torch.cuda.get_device_name(device), profile)


def reset_memory_peak(device: torch.device, meter: CpuPeakMeter | None = None) -> None:
    """Start a step's memory peak: CUDA's allocator statistics, or the CPU meter's window."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    elif meter is not None:
        meter.begin_step()


def memory_stats(device: torch.device, peak_bytes: int | None = None) -> dict:
    """This step's memory. CUDA: the peak of tensor memory allocated and of memory the caching
    allocator reserved since reset_memory_peak. CPU: the process's resident set at the end of
    the step (the OS keeps no per-step peak) - another quantity, hence another key - and, with
    --metrics.cpu_memory_peak, `peak_bytes` (the CPU meter's peak of allocated tensor bytes)
    under CUDA's key."""
    if device.type == "cuda":
        return {
            "memory_peak_allocated_gib": torch.cuda.max_memory_allocated(device) / GIB,
            "memory_peak_reserved_gib": torch.cuda.max_memory_reserved(device) / GIB,
        }
    try:
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):  # not Linux: the lifetime peak is what is there
        import resource

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    peak = {} if peak_bytes is None else {"memory_peak_allocated_gib": peak_bytes / GIB}
    return {**peak, "memory_rss_gib": rss / GIB}


def _memory_text(values: dict) -> str:
    if "memory_peak_reserved_gib" in values:
        return f"mem {values['memory_peak_allocated_gib']:.2f}/{values['memory_peak_reserved_gib']:.2f}GiB"
    peak = (
        f"mem {values['memory_peak_allocated_gib']:.3f}GiB  "
        if "memory_peak_allocated_gib" in values
        else ""
    )
    return f"{peak}rss {values['memory_rss_gib']:.2f}GiB"


class StepMemoryLog:
    """Each step's memory figures, and every rank's own peak file.

    `begin()` before a training step, `end(step)` after it: returns memory_stats' keys. Where a
    peak is measured (CUDA always; CPU with --metrics.cpu_memory_peak, see cpu_memory.py), every
    rank appends {"step": N, "peak_allocated_bytes": int} to <dump_folder>/memory/rank<r>.jsonl
    (metrics.jsonl is rank 0's only), opened at the first step, which drops the records from
    that step on (a resumed run trains them again). Create it early: the CPU meter counts the
    frees of blocks allocated after it was created."""

    def __init__(self, device: torch.device, cpu_peak: bool, dump_folder: str, rank: int):
        self.device = device
        self.meter = CpuPeakMeter() if cpu_peak and device.type == "cpu" else None
        self.file = None
        self.path = None
        if device.type == "cuda" or self.meter is not None:
            self.path = os.path.join(dump_folder, "memory", f"rank{rank}.jsonl")

    def begin(self) -> None:
        reset_memory_peak(self.device, self.meter)

    def end(self, step: int) -> dict:
        peak = None
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device)
        elif self.meter is not None:
            peak = self.meter.end_step()
        if self.path is not None:
            if self.file is None:
                os.makedirs(os.path.dirname(self.path), exist_ok=True)
                _truncate_after(self.path, step - 1)
                self.file = open(self.path, "a")
            self.file.write(json.dumps({"step": step, "peak_allocated_bytes": peak}) + "\n")
            self.file.flush()
        return memory_stats(self.device, peak)

    def close(self) -> None:
        if self.meter is not None:
            self.meter.close()
        if self.file is not None:
            self.file.close()
            self.file = None

    def __enter__(self) -> "StepMemoryLog":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False


def _fmt_duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def _truncate_after(path: str, step: int) -> None:
    """Drop records past the resumed step: that part of the earlier run was lost (crash or
    kill after its last checkpoint) and is trained again, so the file keeps one record per step."""
    if not os.path.isfile(path):
        return

    def keep(line: str) -> bool:
        try:
            return json.loads(line).get("step", 0) <= step
        except ValueError:  # a line cut short by the crash
            return False

    with open(path) as f:
        lines = [ln for ln in f if ln.strip() and keep(ln)]
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.writelines(lines)
    os.replace(tmp, path)


def tensorboard_folder(
    dump_folder: str, tb_folder: str = "tb", rank: int = 0, all_ranks: bool = False
) -> str | None:
    """Where this rank's TensorBoard events go: <dump_folder>/<metrics.save_tb_folder> on rank
    0, or with metrics.save_for_all_ranks <...>/rank_<rank> on every rank; None: this rank
    writes none."""
    base = os.path.join(dump_folder, tb_folder)
    if all_ranks:
        return os.path.join(base, f"rank_{rank}")
    return base if rank == 0 else None


class TensorBoardSink:
    """Scalars as TensorBoard events in `folder` (tensorboard_folder)."""

    def __init__(self, folder: str):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(folder)

    def write(self, step: int, scalars: dict) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self, failed: bool = False, preempted: bool = False) -> None:
        self.writer.close()


class WandbSink:
    """Scalars to a W&B run (rank 0's), the job config as the run config. Project and entity:
    WANDB_PROJECT (default "torchtitan") and WANDB_ENTITY; mode (online / offline / disabled):
    WANDB_MODE, as wandb reads it. The run's files go under <dump_folder>/wandb; a resumed job
    starts a new run. checks/outputs.check_wandb has checked the package and the login."""

    def __init__(self, dump_folder: str, config: dict, name: str):
        import wandb

        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or "torchtitan",
            entity=os.environ.get("WANDB_ENTITY") or None,
            name=name or os.path.basename(os.path.abspath(dump_folder)),
            dir=os.path.abspath(dump_folder),
            config=config,
        )

    def write(self, step: int, scalars: dict) -> None:
        self.run.log(scalars, step=step)

    def close(self, failed: bool = False, preempted: bool = False) -> None:
        if preempted:  # W&B shows the run as preempted (it resumes as a new run)
            self.run.mark_preempting()
        self.run.finish(exit_code=1 if failed else EXIT_PREEMPTED if preempted else 0)


def _mixture_text(values: dict) -> str:
    """'  mix web 70.0% code 30.0%': each source's share of the tokens so far (tokens_seen/<name>)."""
    seen = {k.split("/", 1)[1]: v for k, v in values.items() if k.startswith("tokens_seen/")}
    total = sum(seen.values())
    if not total:
        return ""
    return "  mix " + " ".join(f"{name} {n / total:.1%}" for name, n in seen.items())


def scalars_of(values: dict) -> dict:
    """The values the scalar sinks get: numbers only (not mfu=None, not the comm dicts)."""
    return {k: v for k, v in values.items() if isinstance(v, (int, float))}


class MetricsLogger:
    """Rank 0's metrics (enabled): console, metrics.jsonl and the scalar sinks, which each get
    the same scalars (scalars_of) of every training and validation record. `wandb_config`: the
    job config as a dict to turn W&B on, `run_name` its run's name. `tb_folder`: the
    TensorBoard folder (tensorboard_folder; default <dump_folder>/tb); given on a rank that is
    not enabled (metrics.save_for_all_ranks), that rank writes TensorBoard events and nothing
    else. Use it as a context manager around training: a failure closes it, marking the W&B
    run failed."""

    def __init__(
        self,
        dump_folder: str,
        enabled: bool,
        tensorboard: bool,
        total_steps: int,
        resume_step: int = 0,
        *,
        wandb_config: dict | None = None,
        run_name: str = "",
        tb_folder: str | None = None,
    ):
        self.enabled, self.total_steps = enabled, total_steps
        self.start = time.perf_counter()
        self._step_times: list[float] = []
        self.jsonl = None
        self.sinks: list = []
        self.preempted = False
        tb_folder = tb_folder or (os.path.join(dump_folder, "tb") if enabled else None)
        if not enabled:
            if tensorboard and tb_folder:  # another rank's own TensorBoard folder
                self.sinks.append(TensorBoardSink(tb_folder))
            return
        os.makedirs(dump_folder, exist_ok=True)
        self.jsonl_path = os.path.join(dump_folder, "metrics.jsonl")
        if resume_step > 0:
            _truncate_after(self.jsonl_path, resume_step)
        self.jsonl = open(self.jsonl_path, "a" if resume_step > 0 else "w")
        if tensorboard:
            self.sinks.append(TensorBoardSink(tb_folder))
        if wandb_config is not None:
            self.sinks.append(WandbSink(dump_folder, wandb_config, run_name))

    def _write_scalars(self, step: int, values: dict) -> None:
        scalars = scalars_of(values)
        for sink in self.sinks:
            sink.write(step, scalars)

    def eta(self, step: int, step_time: float) -> float:
        # Skip the first step (compilation, warm-up) once there are others to average.
        self._step_times.append(step_time)
        recent = self._step_times[1:][-20:] or self._step_times
        return (self.total_steps - step) * sum(recent) / len(recent)

    def log(self, step: int, values: dict) -> None:
        """values: loss, grad_norm, lr, tokens_per_sec(_per_device), mfu (or None), the
        memory_stats keys, step_time;
        for MoE models also expert_load_min / expert_load_max (tokens per expert relative to
        the mean, over the step and all layers) and aux_loss when the balance loss is on;
        mtp_loss (multi-token prediction, averaged over its depths) when model.mtp_depth > 0."""
        eta = self.eta(step, values["step_time"])
        if not self.enabled:
            self._write_scalars(step, values)  # a rank's own TensorBoard folder, if any
            return
        record = {
            "step": step,
            **values,
            "elapsed_sec": round(time.perf_counter() - self.start, 3),
            "eta_sec": round(eta, 1),
        }
        mfu = values.get("mfu")
        logger.info(
            f"step {step:>{len(str(self.total_steps))}}/{self.total_steps}"
            f"  loss {values['loss']:.4f}"
            + (f"  aux {values['aux_loss']:.5f}" if "aux_loss" in values else "")
            + (f"  mtp {values['mtp_loss']:.4f}" if "mtp_loss" in values else "")
            + f"  grad_norm {values['grad_norm']:.3f}  lr {values['lr']:.2e}"
            + (f"  groups {values['replica_groups']}" if "replica_groups" in values else "")
            + (
                f"  expert load {values['expert_load_min']:.2f}-{values['expert_load_max']:.2f}x"
                if "expert_load_max" in values
                else ""
            )
            + f"  tok/s/dev {values['tokens_per_sec_per_device']:,.0f}  mfu {'n/a' if mfu is None else f'{mfu:.1%}'}"
            f"  {_memory_text(values)}  step {values['step_time']:.2f}s  eta {_fmt_duration(eta)}"
            + _mixture_text(values)
        )
        self.jsonl.write(json.dumps(record) + "\n")
        self.jsonl.flush()
        self._write_scalars(step, values)

    def log_validation(self, step: int, values: dict, batches: int, seconds: float) -> None:
        """A validation record: {"step", "validation_loss", "validation_perplexity", ...} of its
        own in metrics.jsonl (readers of training records skip it: it has no "loss")."""
        if not self.enabled:
            self._write_scalars(step, values)
            return
        per_source = "".join(
            f"  {k.split('/', 1)[1]} {v:.4f}"
            for k, v in values.items()
            if k.startswith("validation_loss/")
        )
        logger.info(
            f"validation after step {step}:  loss {values['validation_loss']:.4f}"
            f"  perplexity {values['validation_perplexity']:,.2f}{per_source}  ({batches} batches, {seconds:.2f}s)"
        )
        record = {
            "step": step,
            **values,
            "validation_batches": batches,
            "validation_time": round(seconds, 3),
        }
        self.jsonl.write(json.dumps(record) + "\n")
        self.jsonl.flush()
        self._write_scalars(step, values)

    def close(self, failed: bool = False) -> None:
        """Close the files and sinks (once; later calls do nothing). failed: the W&B run ends
        with exit code 1 (shown as failed); `preempted` set by the trainer: marked preempting,
        exit code 75."""
        if self.jsonl is not None:
            self.jsonl.close()
            self.jsonl = None
        sinks, self.sinks = self.sinks, []
        for sink in sinks:
            sink.close(failed, self.preempted and not failed)

    def __enter__(self) -> "MetricsLogger":
        return self

    def __exit__(self, exc_type, *exc) -> bool:
        self.close(failed=exc_type is not None)
        return False
