"""Checks of the small keys upstream torchtitan has and this config took over: the garbage
collector's schedule, the profiler's active/warmup steps, the lr schedule's length, the
validation batch's shape and loader, training.dtype against FSDP sharding. One ConfigError line
each, naming the key and the fix; torch-free.
"""

from torchtitan.config.job_config import AUTO, JobConfig
from torchtitan.config.manager import ConfigError


def check_upstream_keys(cfg: JobConfig, args, dp_shard: int) -> None:
    """Every rule below, in order. `args`: the flavor's model args (max_seq_len);
    `dp_shard`: the resolved data-parallel shard degree."""
    check_gc_and_schedule(cfg)
    check_profiler_steps(cfg)
    check_validation_shape(cfg, args.max_seq_len)
    check_training_dtype(cfg, dp_shard)


def check_gc_and_schedule(cfg: JobConfig) -> None:
    t, lr = cfg.training, cfg.lr_scheduler
    if t.gc_freq < 0:
        raise ConfigError(
            f"--training.gc_freq={t.gc_freq}: must be >= 0 (0: Python's own collection schedule)"
        )
    if lr.total_steps != AUTO and lr.total_steps < 1:
        raise ConfigError(
            f"--lr_scheduler.total_steps={lr.total_steps}: must be >= 1, or auto (= training.steps)"
        )


def check_profiler_steps(cfg: JobConfig) -> None:
    """torch.profiler.schedule's steps: profile_freq and active >= 1, warmup >= 0, warmup and
    active within one profile_freq block."""
    p = cfg.profiling
    if p.profile_freq < 1:
        raise ConfigError(f"--profiling.profile_freq={p.profile_freq}: must be >= 1")
    if p.profiler_active < 1:
        raise ConfigError(f"--profiling.profiler_active={p.profiler_active}: must be >= 1")
    if p.profiler_warmup < 0:
        raise ConfigError(f"--profiling.profiler_warmup={p.profiler_warmup}: must be >= 0")
    if p.enable_profiling and p.profile_freq < p.profiler_active + p.profiler_warmup:
        raise ConfigError(
            f"--profiling.profiler_warmup={p.profiler_warmup} + profiler_active={p.profiler_active}"
            f" exceed --profiling.profile_freq={p.profile_freq}: a trace's warmup and recorded steps"
            " fit in one profile_freq block; raise profile_freq or lower the other two"
        )


def check_validation_shape(cfg: JobConfig, max_seq_len: int) -> None:
    """validation.local_batch_size / seq_len (auto: training's) and its loader's workers."""
    v, t, p = cfg.validation, cfg.training, cfg.parallelism
    workers = v.dataloader.num_workers
    if workers != AUTO and (not isinstance(workers, int) or workers < 0):
        raise ConfigError(
            f"--validation.dataloader.num_workers={workers}: must be >= 0 (0: read on the training"
            " thread) or auto"
        )
    for section, loader in (("training", t.dataloader), ("validation", v.dataloader)):
        if loader.prefetch_factor != AUTO and loader.prefetch_factor < 1:
            raise ConfigError(
                f"--{section}.dataloader.prefetch_factor={loader.prefetch_factor}: must be >= 1,"
                " or auto (torch's default, 2)"
            )
    if not v.enable:
        return
    shape = {"local_batch_size": v.local_batch_size, "seq_len": v.seq_len}
    for key, value in shape.items():
        if value != AUTO and value < 1:
            raise ConfigError(f"--validation.{key}={value}: must be >= 1, or auto (training's)")
    if v.seq_len != AUTO and v.seq_len > max_seq_len:
        raise ConfigError(
            f"--validation.seq_len={v.seq_len} exceeds the model's max_seq_len {max_seq_len}"
        )
    fixed = [
        name
        for name, degree in (
            ("pipeline_parallel_degree", p.pipeline_parallel_degree),
            ("context_parallel_degree", p.context_parallel_degree),
        )
        if degree > 1
    ]
    for key, value in shape.items():
        if fixed and value != AUTO and value != getattr(t, key):
            raise ConfigError(
                f"--validation.{key}={value}: differs from --training.{key}={getattr(t, key)}, which"
                f" --parallelism.{fixed[0]}={getattr(p, fixed[0])} fixes (its shapes are the"
                f" training step's); set --validation.{key}=auto"
            )
    tp = p.tensor_parallel_degree
    if v.seq_len != AUTO and tp > 1 and v.seq_len % tp:
        raise ConfigError(
            f"--validation.seq_len={v.seq_len}: does not split over --parallelism.tensor_parallel_degree"
            f"={tp} (sequence parallel); pick a multiple of {tp}, or auto"
        )


def check_training_dtype(cfg: JobConfig, dp_shard: int) -> None:
    """training.dtype=bfloat16 keeps the parameters themselves in bf16: only without FSDP,
    whose bf16 training is mixed precision (fp32 parameters, bf16 all-gathers)."""
    t, cp = cfg.training, cfg.parallelism.context_parallel_degree
    if t.dtype == "bfloat16" and dp_shard * cp > 1:
        what = (
            f"--parallelism.data_parallel_shard_degree={dp_shard}"
            if dp_shard > 1
            else f"--parallelism.context_parallel_degree={cp}"
        )
        raise ConfigError(
            f"--training.dtype=bfloat16: this job shards its parameters with FSDP ({what}), which"
            " trains in bf16 by mixed precision instead: use --training.mixed_precision_param=bfloat16"
            " (fp32 parameters, bf16 compute) and leave training.dtype float32"
        )
