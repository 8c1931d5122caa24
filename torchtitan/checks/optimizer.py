"""Where the optimizer steps: in backward (optimizer.early_step_in_backward) and on the host
(training.enable_cpu_offload); Muon's keys (check_muon_keys). Torch-free; one ConfigError
line naming the key and the fix."""

from torchtitan.config.job_config import JobConfig
from torchtitan.config.manager import ConfigError
from torchtitan.distributed.job_shape import batch_shape

EARLY = "--optimizer.early_step_in_backward"


def check_optimizer_placement(cfg: JobConfig, dp_shard: int) -> None:
    """After check_training (the batch shape is valid); `dp_shard` as check_layout resolved it."""
    p, t = cfg.parallelism, cfg.training
    if t.enable_cpu_offload and p.fsdp_implementation == "simple_fsdp":
        raise ConfigError(
            "--training.enable_cpu_offload is FSDP2's CPUOffloadPolicy and"
            " --parallelism.fsdp_implementation=simple_fsdp has none; use fsdp2 or turn offload off"
        )
    if not cfg.optimizer.early_step_in_backward:
        return
    accum_steps = batch_shape(cfg, p.data_parallel_replicate_degree * dp_shard).accum_steps
    # Each parameter steps in its gradient hook, alone: whatever needs every gradient of the
    # step first (a second micro-batch's share, a replica group's quorum) or gradients that
    # arrive in pieces (pipeline stages, routed experts) cannot be. A global norm to clip by
    # cannot exist either; upstream trains on without clipping, and so do we, with one warning
    # line (early_step_clip_warning).
    refused = [
        (
            p.pipeline_parallel_degree > 1,
            f"--parallelism.pipeline_parallel_degree={p.pipeline_parallel_degree}",
            "set it to 1",
        ),
        (
            p.expert_parallel_degree > 1,
            f"--parallelism.expert_parallel_degree={p.expert_parallel_degree}",
            "set it to 1",
        ),
        (
            cfg.fault_tolerance.enable,
            "--fault_tolerance.enable",
            "turn fault tolerance off",
        ),
        (
            accum_steps > 1,
            f"{accum_steps} gradient-accumulation steps (each backward would step)",
            "make global_batch_size = local_batch_size x the data-parallel degree",
        ),
    ]
    for bad, what, fix in refused:
        if bad:
            raise ConfigError(
                f"{EARLY} steps each parameter inside backward: not with {what}; {fix}"
            )


def early_step_clip_warning(cfg: JobConfig) -> str | None:
    """The warning a job that steps in backward with max_norm > 0 gets: nothing is clipped."""
    t = cfg.training
    if not (cfg.optimizer.early_step_in_backward and t.max_norm > 0):
        return None
    return (
        f"--training.max_norm={t.max_norm} is not applied with {EARLY}: each parameter steps"
        " in its gradient hook before a global norm exists (upstream skips clipping the same"
        " way); the logged grad_norm is the unclipped norm. Set --training.max_norm=0 to"
        " silence this"
    )


def check_muon_keys(cfg: JobConfig) -> None:
    """optimizer.name = Muon: its keys in range, and where it cannot step (its parameter
    split against the model: checks/job.check_muon_split)."""
    o = cfg.optimizer
    if o.name.lower() != "muon":
        return
    key = "--optimizer"
    if len(o.muon_ns_coefficients) != 3:
        raise ConfigError(
            f"{key}.muon_ns_coefficients={o.muon_ns_coefficients}: give the quintic's 3"
            " coefficients (a, b, c), e.g. [3.4445, -4.775, 2.0315]"
        )
    if o.muon_ns_steps < 1:
        raise ConfigError(f"{key}.muon_ns_steps={o.muon_ns_steps}: must be >= 1")
    if not 0.0 <= o.muon_momentum < 1.0:
        raise ConfigError(f"{key}.muon_momentum={o.muon_momentum}: must be in [0, 1)")
    if o.muon_lr < 0 or o.muon_weight_decay < 0:
        raise ConfigError(
            f"{key}.muon_lr={o.muon_lr}, muon_weight_decay={o.muon_weight_decay}: must be >= 0"
        )
    if o.early_step_in_backward:
        raise ConfigError(
            f"{EARLY} with {key}.name={o.name}: Muon orthogonalizes each whole matrix after the"
            " step's gradients are reduced; turn early_step_in_backward off"
        )
    if cfg.training.enable_cpu_offload:
        raise ConfigError(
            f"--training.enable_cpu_offload with {key}.name={o.name}: Muon's gathers run on"
            " the device; turn offload off or use AdamW"
        )
