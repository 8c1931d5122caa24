"""The pre-launch checks of a whole job, in order (check_job): no process group, nothing
written; the first problem is one `ConfigError` line naming the key and the fix. Runs before
torchrun starts workers (run_train.sh) and again at the top of every worker.

The concerns live beside this: the model and its layout (layout.py), the data and tokenizer
(data.py), what a run writes and how it ends (outputs.py); here are the training numbers and
the memory keys, with the model-states floor against the memory budget.
"""

import math
import os
from collections.abc import Callable

from torchtitan import hardware
from torchtitan.checks.compile_keys import check_compile_keys
from torchtitan.checks.data import (
    check_data_inputs,
    check_dataset_path,
    in_entry,
    in_mix,
    training_datasets,
    validation_sets,
)
from torchtitan.checks.fault_tolerance import check_fault_tolerance, check_lighthouse_of
from torchtitan.checks.layout import (
    check_activation_checkpoint,
    check_fsdp_policies,
    check_layout,
    check_model,
)
from torchtitan.checks.optimizer import check_muon_keys, check_optimizer_placement
from torchtitan.checks.outputs import check_outputs, check_wandb
from torchtitan.checks.quantize import check_converters
from torchtitan.checks.upstream_keys import check_upstream_keys
from torchtitan.checks.upstream_only import check_upstream_only
from torchtitan.config.job_config import AUTO, JobConfig
from torchtitan.config.manager import ConfigError
from torchtitan.distributed.job_shape import ShapeError, batch_shape
from torchtitan.models.common.attn_backend import ATTN_BACKENDS, attn_backend_of, implied_attn_mask
from torchtitan.planning.memory import budget as memory_budget
from torchtitan.planning.memory import model_states
from torchtitan.training.model_args import run_model_args
from torchtitan.units import gib_text


def check_job(cfg: JobConfig, world_size: int) -> None:
    """Raise ConfigError for the first problem found, one concern after another."""
    check_upstream_only(cfg)
    check_fault_tolerance(cfg)
    args = check_model(cfg)
    check_model_fragments(cfg, args)
    check_muon_keys(cfg)
    check_muon_split(cfg, args)
    check_attention_backend(cfg, args)
    dp_shard = check_layout(cfg, args, world_size)
    global_batch = check_training(cfg, args, dp_shard)
    check_upstream_keys(cfg, args, dp_shard)
    check_optimizer_placement(cfg, dp_shard)
    check_activation_checkpoint(cfg)
    check_compile_keys(cfg)
    check_validation_and_profiling(cfg)
    check_inputs(cfg, args, global_batch)
    check_converters(cfg, linear_names(cfg))
    check_fsdp_policies(cfg)
    check_outputs(cfg, world_size, global_batch)
    check_wandb(cfg)
    check_memory_keys(cfg)
    check_hardware_keys(cfg)
    check_model_states(cfg, args, world_size)
    check_lighthouse_of(cfg)


def _meta_model(cfg: JobConfig, args):
    """The job's model on meta, for the checks that need its module and parameter names (its
    build's warnings kept out of the one error line)."""
    import warnings

    from torchtitan.training.planned_job import model_on_meta

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model_on_meta(cfg, args).model


def check_model_fragments(cfg: JobConfig, args) -> None:
    """DiLoCo's fragments (fault_tolerance.num_fragments > 1, or named modules) on the model
    built on meta: each named module exists, every parameter in exactly one fragment."""
    f = cfg.fault_tolerance
    if not (f.enable and f.semi_sync_method == "diloco"):
        return
    if f.num_fragments > 1 or f.module_fqns_per_model_fragment:
        from torchtitan.training.semi_sync import fragments

        fragments([_meta_model(cfg, args)], f)


def check_muon_split(cfg: JobConfig, args) -> None:
    """optimizer.name = Muon with name patterns: each matches a parameter of the model built on
    meta, and Muon's are matrices (training/muon.py)."""
    o = cfg.optimizer
    if o.name.lower() != "muon" or not (o.muon_params or o.adamw_params):
        return
    from torchtitan.models.common.init import clean_fqn
    from torchtitan.training.muon import check_patterns, split

    named = [(clean_fqn(n), p) for n, p in _meta_model(cfg, args).named_parameters()]
    check_patterns([n for n, _ in named], o)
    split(named, o)


def accepts(world_size: int) -> Callable[[JobConfig], bool]:
    """Whether check_job lets a job of `world_size` ranks run (the memory fit's candidates)."""

    def ok(cfg: JobConfig) -> bool:
        try:
            check_job(cfg, world_size)
        except ConfigError:
            return False
        return True

    return ok


def linear_names(cfg: JobConfig) -> list[str] | None:
    """The model's linear layers by name (its shapes.py), for [quantize]'s filters; None when no
    converter is on (the tokenizer's vocabulary need not be read)."""
    if not cfg.model.converters:
        return None
    shapes = model_states.model_shapes(cfg.model.name, run_model_args(cfg))
    params = shapes.first + [p for block in shapes.blocks for p in block] + shapes.last
    return [p.name.removesuffix(".weight") for p in params if p.linear]  # tied ones too


def check_attention_backend(cfg: JobConfig, args) -> None:
    """The flavor's attention kernel is known; a flex / varlen flavor attends within documents,
    which the causal mask contradicts (models/common/attn_backend.py)."""
    m = cfg.model
    backend = attn_backend_of(args)
    if backend not in ATTN_BACKENDS:
        raise ConfigError(
            f"--model.flavor={m.flavor}: attn_backend {backend!r} of {m.name} is not one of"
            f" {', '.join(ATTN_BACKENDS)}; fix the flavor's args"
        )
    if implied_attn_mask(args) and m.attn_mask == "causal":
        raise ConfigError(
            f"--model.attn_mask=causal: flavor {m.flavor} attends with {backend} attention within"
            f" documents; set --model.attn_mask=block_causal or pick a flavor without {backend}"
        )


def check_training(cfg: JobConfig, args, dp_shard: int) -> int:
    """Training, optimizer, schedule and logging numbers; returns the global batch size."""
    t, p = cfg.training, cfg.parallelism
    for key in ("steps", "local_batch_size", "seq_len"):
        if getattr(t, key) < 1:
            raise ConfigError(f"--training.{key}={getattr(t, key)}: must be >= 1")
    if t.seq_len > args.max_seq_len:
        raise ConfigError(
            f"--training.seq_len={t.seq_len} exceeds the model's max_seq_len {args.max_seq_len}"
        )
    try:
        global_batch = batch_shape(cfg, p.data_parallel_replicate_degree * dp_shard).global_batch
    except ShapeError as e:
        raise ConfigError(str(e)) from None
    if t.max_norm < 0:
        raise ConfigError(f"--training.max_norm={t.max_norm}: must be >= 0 (0 disables clipping)")
    if cfg.optimizer.lr <= 0:
        raise ConfigError(f"--optimizer.lr={cfg.optimizer.lr}: must be > 0")
    if cfg.lr_scheduler.warmup_steps < 0:
        raise ConfigError(
            f"--lr_scheduler.warmup_steps={cfg.lr_scheduler.warmup_steps}: must be >= 0"
        )
    if not 0.0 <= cfg.lr_scheduler.decay_ratio <= 1.0:
        raise ConfigError(
            f"--lr_scheduler.decay_ratio={cfg.lr_scheduler.decay_ratio}: must be in [0, 1]"
        )
    if cfg.metrics.log_freq < 1:
        raise ConfigError(f"--metrics.log_freq={cfg.metrics.log_freq}: must be >= 1")
    if cfg.checkpoint.interval < 1:
        raise ConfigError(f"--checkpoint.interval={cfg.checkpoint.interval}: must be >= 1")
    return global_batch


def check_validation_and_profiling(cfg: JobConfig) -> None:
    """[validation] counts and [profiling] folders (its step counts: checks/upstream_keys.py);
    the profiler has one user."""
    for key, value in (
        ("validation.freq", cfg.validation.freq),
        ("validation.steps", cfg.validation.steps),
    ):
        if value < 1:
            raise ConfigError(f"--{key}={value}: must be >= 1")
    p = cfg.profiling
    for key, enabled in (
        ("save_traces_folder", p.enable_profiling),
        ("save_memory_snapshot_folder", p.enable_memory_snapshot),
    ):
        path = os.path.join(cfg.job.dump_folder, getattr(p, key))
        if enabled and os.path.isfile(path):
            raise ConfigError(
                f"--profiling.{key}: '{path}' is a file; give a folder name (relative to --job.dump_folder)"
            )
    if cfg.metrics.cpu_memory_peak and p.enable_profiling and cfg.training.device != "cuda":
        raise ConfigError(
            "--metrics.cpu_memory_peak=true and --profiling.enable_profiling=true cannot run together (only one"
            " torch profiler runs in a process): set one of them to false"
        )


def check_inputs(cfg: JobConfig, args, global_batch: int) -> None:
    """Tokenizer and datasets (training and validation), read and checked the way the run
    will read them (not by a dry run, which reads neither data nor tokenizer)."""
    t = cfg.training
    if not cfg.job.dry_run:
        for name in training_datasets(t):
            in_mix(name, t, lambda name=name: check_dataset_path(name))
        if cfg.validation.enable:
            check_dataset_path(cfg.validation.dataset, "validation")
            for name in validation_sets(cfg.validation):
                in_entry(
                    name,
                    "validation",
                    "per_source",
                    lambda name=name: check_dataset_path(name, "validation"),
                )
    check_data_inputs(cfg, args, global_batch)


def check_memory_keys(cfg: JobConfig) -> None:
    """planning.fit, the layout search's keys and planning.memory_skew (the memory prediction's own keys)."""
    if cfg.planning.fit and not cfg.job.dry_run:
        raise ConfigError(
            f"--planning.fit={cfg.planning.fit} searches with the prediction of a dry run; add --job.dry_run=true"
        )
    if cfg.planning.layout_candidates < 1:
        raise ConfigError(
            f"--planning.layout_candidates={cfg.planning.layout_candidates}: must be >= 1 (layouts the layout"
            " search simulates in full)"
        )
    if not 0 < cfg.planning.layout_seconds < math.inf:
        raise ConfigError(
            f"--planning.layout_seconds={cfg.planning.layout_seconds:g}: must be > 0 (seconds of full simulations"
            " the layout search may take)"
        )
    named = hardware.PROFILES.get(cfg.hardware.profile)  # auto / local: checked by the search
    if cfg.planning.layout_float8 == "choose" and named and "float8" not in named.peak_tflops:
        raise ConfigError(
            f"--planning.layout_float8=choose: {named.name} has no float8 tensor cores (SM89"
            " or later); use --planning.layout_float8=keep or a profile with them"
        )
    skew = cfg.planning.memory_skew
    if not (1 <= skew < math.inf):
        raise ConfigError(
            f"--planning.memory_skew={skew:g}: must be >= 1 (1 = balanced routing; the expert-parallel degree"
            " = every token copy on one rank)"
        )
    check_memory_env(os.environ)


# The memory prediction's environment settings: name -> (smallest value, what it sets)
MEMORY_ENV = {
    "TITAN_MEMORY_WORKERS": (
        1,
        "processes the memory prediction runs its simulations in; 1 = this one",
    ),
    "TITAN_MEMORY_EXACT_LIMIT": (
        0,
        "block-microbatches per rank above which large jobs are extrapolated",
    ),
}


def check_hardware_keys(cfg: JobConfig) -> None:
    """[hardware] overrides: positive numbers (clock_factor and gemm_efficiency at most 1)."""
    hw = cfg.hardware
    for key in hardware.OVERRIDES:  # the keys the profile takes (one list: hardware.py)
        value = getattr(hw, key)
        if value == "auto":
            continue
        top = 1 if key in ("gemm_efficiency", "clock_factor") else None
        if value <= 0 or (top is not None and value > top):
            raise ConfigError(
                f"--hardware.{key}={value}: must be > 0"
                + (f" and <= {top}" if top else "")
                + " (or auto: the profile's value)"
            )


def check_memory_env(env) -> None:
    for name, (low, what) in MEMORY_ENV.items():
        value = env.get(name, "")
        if value and not (value.isdigit() and int(value) >= low):
            raise ConfigError(
                f"{name}={value}: must be an integer >= {low} ({what}); unset it for the default"
            )


def check_model_states(cfg: JobConfig, args, world_size: int) -> None:
    """memory_budget_gib's value; then, unless this is a dry run (it reports, never refuses) or
    planning.allow_over_budget is set, refuse a job whose busiest rank's parameters, gradients and
    AdamW states alone exceed the memory budget (planning/memory/model_states.py, budget.py)."""
    m = cfg.model
    value = cfg.planning.memory_budget_gib
    if value not in (AUTO, "none") and not 0 < value < math.inf:
        raise ConfigError(
            f"--planning.memory_budget_gib={value:g}: must be > 0 (GiB per rank), auto (the default"
            " budget of the device) or none (no budget)"
        )
    if cfg.job.dry_run or cfg.planning.allow_over_budget:
        return
    ranks = memory_budget.ranks_on_this_node(world_size)
    budget = memory_budget.memory_budget(cfg, ranks, started_rank="LOCAL_RANK" in os.environ)
    if budget is None:
        return
    run_args = run_model_args(cfg)  # the tokenizer's vocabulary (check_inputs loaded it already)
    rank = model_states.busiest(model_states.job_rank_states(cfg, world_size, run_args))
    if rank.total_bytes <= budget.bytes:
        return
    gib = gib_text
    raise ConfigError(
        f"--model.flavor={m.flavor}: model states alone need {gib(rank.total_bytes)} GiB per rank (parameters"
        f" {gib(rank.params_bytes)}, gradients {gib(rank.grads_bytes)}, AdamW {gib(rank.optimizer_bytes)};"
        f" {rank.where()}, {world_size} rank{'s' if world_size > 1 else ''}) but the memory budget is"
        f" {gib(budget.bytes)} GiB ({budget.origin}); use more ranks or sharding (NGPU,"
        " data_parallel_shard_degree, tensor_parallel_degree, pipeline_parallel_degree), or set"
        " --planning.memory_budget_gib (none: no budget)"
    )
