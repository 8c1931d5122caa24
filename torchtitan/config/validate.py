"""Checks that need no process group: degrees vs world size, shapes, batch sizes, paths.

Each failure is one `ConfigError` line naming the key and the fix. Runs before torchrun
starts workers (run_train.sh) and again at the top of every worker.
"""

import math
import os

from torchtitan.config.job_config import JobConfig
from torchtitan.components.corpus import LOCAL_FILE_BUILDERS
from torchtitan.config.manager import ConfigError, _suggest
from torchtitan.config.validate_outputs import check_outputs, check_wandb
from torchtitan.distributed.job_shape import ShapeError, batch_shape, degrees, pipeline_microbatches
from torchtitan.distributed.pipeline_layout import PipelineLayoutError, plan_pipeline
from torchtitan.distributed.reshard_policy import ReshardPolicyError, check_policy
from torchtitan.models.flavors import MODEL_FLAVORS

def resolve_dp_shard(cfg: JobConfig, world_size: int) -> int:
    """The data-parallel shard degree (-1 resolved), by job_shape's rule."""
    try:
        return degrees(cfg, world_size).dp_shard
    except ShapeError as e:
        raise ConfigError(str(e)) from None


def _check_path_like_dataset(dataset: str, section: str = "training") -> None:
    if dataset == "pydoc":
        return
    looks_local = (
        dataset.startswith((".", "/", "~"))
        or dataset.endswith(tuple(LOCAL_FILE_BUILDERS))
        or os.path.exists(dataset)
    )
    kinds = "/".join(LOCAL_FILE_BUILDERS)
    path = os.path.expanduser(dataset)
    if looks_local and not os.path.exists(path):
        raise ConfigError(
            f"--{section}.dataset: local dataset path '{dataset}' does not exist; give an existing"
            f" {kinds} file or folder, 'pydoc', or an HF hub name"
        )
    if os.path.isfile(path) and os.path.splitext(path)[1] not in LOCAL_FILE_BUILDERS:
        raise ConfigError(f"--{section}.dataset: cannot read '{dataset}': use a {kinds} file or a folder")


def validate(cfg: JobConfig, world_size: int) -> None:
    """Raise ConfigError for the first problem found, one concern after another."""
    args = check_model(cfg)
    dp_shard = check_layout(cfg, args, world_size)
    global_batch = check_training(cfg, args, dp_shard)
    check_activation_checkpoint(cfg)
    check_validation_and_profiling(cfg)
    check_inputs(cfg, args, global_batch)
    check_fsdp_policies(cfg)
    check_outputs(cfg, world_size, global_batch)
    check_wandb(cfg)
    check_memory_keys(cfg)
    check_model_states(cfg, args, world_size)


def check_model(cfg: JobConfig):
    """Model name and flavor; returns the flavor's args."""
    m = cfg.model
    if m.name not in MODEL_FLAVORS:
        raise ConfigError(
            f"--model.name: unknown model '{m.name}'{_suggest(m.name, MODEL_FLAVORS)};"
            f" choose one of {', '.join(MODEL_FLAVORS)}"
        )
    flavors = MODEL_FLAVORS[m.name]
    if m.flavor not in flavors:
        raise ConfigError(
            f"--model.flavor: unknown flavor '{m.flavor}' of {m.name}{_suggest(m.flavor, flavors)};"
            f" choose one of {', '.join(flavors)}"
        )
    if m.attn_mask not in ("causal", "block_causal"):
        raise ConfigError(f"--model.attn_mask={m.attn_mask}: choose causal or block_causal")
    return flavors[m.flavor]


def check_layout(cfg: JobConfig, args, world_size: int) -> int:
    """Degrees vs world size and the model's shapes (heads, experts, layers per stage);
    returns the data-parallel shard degree."""
    m, t, p = cfg.model, cfg.training, cfg.parallelism
    dp_shard = resolve_dp_shard(cfg, world_size)
    tp = p.tensor_parallel_degree
    for key in ("n_heads", "n_kv_heads"):
        heads = getattr(args, key, None)
        if heads and heads % tp:
            raise ConfigError(
                f"--parallelism.tensor_parallel_degree={tp} does not divide {m.name} {m.flavor}"
                f" {key}={heads}; pick a divisor of {heads}"
            )
    check_moe(cfg, args)
    check_mtp(cfg)
    check_context_parallel(cfg)
    check_expert_parallel(cfg, args, dp_shard)
    if p.pipeline_parallel_degree > 1:
        try:
            plan_pipeline(
                args.n_layers, p.pipeline_parallel_degree, p.pipeline_parallel_schedule,
                p.pipeline_parallel_layers_per_stage, p.pipeline_parallel_split_points, pipeline_microbatches(cfg),
            )
        except (ShapeError, PipelineLayoutError) as e:
            raise ConfigError(str(e)) from None
    return dp_shard


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
        raise ConfigError(f"--lr_scheduler.warmup_steps={cfg.lr_scheduler.warmup_steps}: must be >= 0")
    if not 0.0 <= cfg.lr_scheduler.decay_ratio <= 1.0:
        raise ConfigError(f"--lr_scheduler.decay_ratio={cfg.lr_scheduler.decay_ratio}: must be in [0, 1]")
    if cfg.metrics.log_freq < 1:
        raise ConfigError(f"--metrics.log_freq={cfg.metrics.log_freq}: must be >= 1")
    if cfg.checkpoint.interval < 1:
        raise ConfigError(f"--checkpoint.interval={cfg.checkpoint.interval}: must be >= 1")
    return global_batch


def check_activation_checkpoint(cfg: JobConfig) -> None:
    """selective_ac_option: "op" or a positive integer."""
    option = cfg.activation_checkpoint.selective_ac_option
    if cfg.activation_checkpoint.mode == "selective" and option != "op":
        if not option.isdigit() or int(option) < 1:
            raise ConfigError(
                f"--activation_checkpoint.selective_ac_option={option!r}: use 'op' or a positive"
                " integer n (checkpoint every n-th block)"
            )


def check_inputs(cfg: JobConfig, args, global_batch: int) -> None:
    """Tokenizer and datasets (training and validation), read and checked the way the run
    will read them (not by a dry run, which reads neither data nor tokenizer)."""
    from torchtitan.config.check_data import check_data_inputs

    t = cfg.training
    if not cfg.job.dry_run:
        _check_path_like_dataset(t.dataset)
        if cfg.validation.enable:
            _check_path_like_dataset(cfg.validation.dataset, "validation")
    check_data_inputs(cfg, args, global_batch)


def check_validation_and_profiling(cfg: JobConfig) -> None:
    """[validation] and [profiling] counts; the profiler has one user."""
    for key, value in (("validation.freq", cfg.validation.freq), ("validation.steps", cfg.validation.steps),
                       ("profiling.profile_freq", cfg.profiling.profile_freq)):
        if value < 1:
            raise ConfigError(f"--{key}={value}: must be >= 1")
    p = cfg.profiling
    for key, enabled in (("save_traces_folder", p.enable_profiling), ("save_memory_snapshot_folder", p.enable_memory_snapshot)):
        path = os.path.join(cfg.job.dump_folder, getattr(p, key))
        if enabled and os.path.isfile(path):
            raise ConfigError(f"--profiling.{key}: '{path}' is a file; give a folder name (relative to --job.dump_folder)")
    if cfg.metrics.cpu_memory_peak and p.enable_profiling and cfg.training.device != "cuda":
        raise ConfigError(
            "--metrics.cpu_memory_peak=true and --profiling.enable_profiling=true cannot run together (only one"
            " torch profiler runs in a process): set one of them to false"
        )


def check_fsdp_policies(cfg: JobConfig) -> None:
    """fsdp_ac_policy, reshard_after_forward and its budget against the rest of the job."""
    p = cfg.parallelism
    ac = cfg.activation_checkpoint
    if ac.fsdp_ac_policy != "auto" and p.fsdp_implementation == "fsdp2":
        raise ConfigError(
            f"--activation_checkpoint.fsdp_ac_policy={ac.fsdp_ac_policy} needs"
            " --parallelism.fsdp_implementation=simple_fsdp: fsdp2's hooks already gather once for"
            " recompute and backward; use fsdp_ac_policy=auto"
        )
    if ac.fsdp_ac_policy == "save" and p.reshard_after_forward == "always":
        raise ConfigError(
            "--activation_checkpoint.fsdp_ac_policy=save contradicts --parallelism.reshard_after_forward=always"
            " (saving the gathered parameters for backward is not resharding); use fsdp_ac_policy=auto"
            " or reshard_after_forward=auto|never"
        )
    if cfg.metrics.held_for_backward and p.pipeline_parallel_degree > 1:
        raise ConfigError(
            "--metrics.held_for_backward is measured around one forward/backward, which a pipeline"
            " schedule interleaves; measure it with --parallelism.pipeline_parallel_degree=1"
        )
    try:
        check_policy(p.reshard_after_forward, p.pipeline_parallel_degree > 1, p.pipeline_parallel_schedule)
    except ReshardPolicyError as e:
        raise ConfigError(str(e)) from None


def check_moe(cfg: JobConfig, args) -> None:
    """The [moe] keys: only for models with experts, each within its range."""
    moe, m = cfg.moe, cfg.model
    experts = getattr(args, "n_routed_experts", 0)
    changed = [k for k, v, default in (("top_k", moe.top_k, 0), ("score_func", moe.score_func, "flavor"),
                                       ("load_balance_coeff", moe.load_balance_coeff, -1.0),
                                       ("aux_loss_coeff", moe.aux_loss_coeff, -1.0)) if v != default]
    if changed and not experts:
        raise ConfigError(f"--moe.{changed[0]}: model {m.name} has no experts; drop the [moe] settings")
    if not experts:
        return
    if moe.top_k < 0:
        raise ConfigError(f"--moe.top_k={moe.top_k}: must be >= 1 (or 0 for the flavor's {args.n_activated_experts})")
    routable = experts // args.n_expert_groups * args.n_limited_groups
    if moe.top_k > routable:
        raise ConfigError(
            f"--moe.top_k={moe.top_k} exceeds the {routable} experts a token can reach ({m.name} {m.flavor}:"
            f" {args.n_limited_groups} of {args.n_expert_groups} groups of {experts // args.n_expert_groups});"
            f" pick at most {routable}"
        )
    for key in ("load_balance_coeff", "aux_loss_coeff"):
        value = getattr(moe, key)
        if not math.isfinite(value) or (value < 0 and value != -1):
            raise ConfigError(f"--moe.{key}={value}: must be >= 0 (0 disables it) or -1 for the flavor's value")
    aux = args.aux_loss_coeff if moe.aux_loss_coeff == -1 else moe.aux_loss_coeff
    p = cfg.parallelism
    for key, degree in (("pipeline_parallel_degree", p.pipeline_parallel_degree),
                        ("tensor_parallel_degree", p.tensor_parallel_degree)):
        if aux > 0 and degree > 1:  # PP: not every stage reaches the loss; TP: each rank sees a sequence chunk
            raise ConfigError(
                f"--moe.aux_loss_coeff={aux:g} (the sequence-wise balance loss) is not supported with"
                f" --parallelism.{key}={degree} yet; set --moe.aux_loss_coeff=0 (the bias-based balancing stays on)"
            )


def check_mtp(cfg: JobConfig) -> None:
    """Multi-token prediction: a DeepSeek-V3 feature."""
    m, t = cfg.model, cfg.training
    if m.mtp_depth < 0:
        raise ConfigError(f"--model.mtp_depth={m.mtp_depth}: must be >= 0 (0 = no multi-token prediction)")
    if not (t.mtp_loss_weight >= 0 and math.isfinite(t.mtp_loss_weight)):
        raise ConfigError(f"--training.mtp_loss_weight={t.mtp_loss_weight}: must be >= 0 (0.3 in the DeepSeek-V3"
                          " report)")
    if m.mtp_depth == 0:
        return
    if m.name != "deepseek_v3":
        raise ConfigError(f"--model.mtp_depth={m.mtp_depth}: multi-token prediction is implemented for deepseek_v3"
                          f" only, not {m.name}; set --model.mtp_depth=0")


def check_context_parallel(cfg: JobConfig) -> None:
    """Each CP rank holds two equal chunks of every sequence; sequence parallel then splits
    a rank's tokens over TP."""
    p, t = cfg.parallelism, cfg.training
    cp, tp = p.context_parallel_degree, p.tensor_parallel_degree
    if cp == 1:
        return
    if t.seq_len % (2 * cp):
        raise ConfigError(
            f"--parallelism.context_parallel_degree={cp} cuts each sequence into 2 x {cp} chunks but"
            f" --training.seq_len={t.seq_len} is not a multiple of {2 * cp}; pick a seq_len that is"
        )
    if tp > 1 and (t.seq_len // cp) % tp:
        raise ConfigError(
            f"--training.seq_len={t.seq_len}: a CP rank's {t.seq_len // cp} tokens do not split over"
            f" --parallelism.tensor_parallel_degree={tp} (sequence parallel); pick a seq_len that is a"
            f" multiple of {math.lcm(2 * cp, cp * tp)}"
        )


def check_expert_parallel(cfg: JobConfig, args, dp_shard: int) -> None:
    """EP borrows all of tp's and cp's ranks, then dp_shard's; experts split evenly over it."""
    p, m = cfg.parallelism, cfg.model
    ep, tp, cp = p.expert_parallel_degree, p.tensor_parallel_degree, p.context_parallel_degree
    experts = getattr(args, "n_routed_experts", 0)
    if experts and ep > 1 and cp > 1 and ep % (tp * cp):
        raise ConfigError(
            f"--parallelism.expert_parallel_degree={ep} with --parallelism.context_parallel_degree={cp}"
            f" must be a multiple of tensor_parallel_degree x context_parallel_degree = {tp * cp}:"
            " every CP rank routes its own tokens, so EP takes all of CP"
        )
    if experts and tp > 1 and ep % tp:
        raise ConfigError(
            f"--parallelism.tensor_parallel_degree={tp} with {m.name} needs --parallelism.expert_parallel_degree"
            f" a multiple of {tp} (it is {ep}): under sequence parallel each TP rank routes its own tokens"
            " and EP, which takes every TP rank, brings them to their experts"
        )
    if ep == 1:
        return
    if not experts:
        raise ConfigError(f"--parallelism.expert_parallel_degree={ep}: model {m.name} has no experts; set it to 1")
    if dp_shard % (ep // (tp * cp)):
        by = "tp x cp" if cp > 1 else "tp"
        raise ConfigError(
            f"--parallelism.expert_parallel_degree={ep} takes {ep // (tp * cp)} ranks from data_parallel_shard_degree"
            f"={dp_shard} (ep / {'(tp x cp)' if cp > 1 else 'tp'}), which does not divide it; pick an"
            f" expert_parallel_degree of {by} x a divisor of {dp_shard}"
        )
    if experts % ep:
        raise ConfigError(
            f"--parallelism.expert_parallel_degree={ep} does not divide {m.name} {m.flavor}"
            f" n_routed_experts={experts}; pick a divisor of {experts}"
        )
    if dp_shard == 1 and p.data_parallel_replicate_degree > 1:
        raise ConfigError(
            f"--parallelism.expert_parallel_degree={ep} with DDP (data_parallel_shard_degree=1) is not"
            " supported; shard the data-parallel ranks (data_parallel_shard_degree > 1)"
        )


def check_memory_keys(cfg: JobConfig) -> None:
    """job.fit and moe.memory_skew (the memory prediction's own keys)."""
    if cfg.job.fit and not cfg.job.dry_run:
        raise ConfigError(f"--job.fit={cfg.job.fit} searches with the prediction of a dry run; add --job.dry_run=true")
    skew = cfg.moe.memory_skew
    if not (1 <= skew < math.inf):
        raise ConfigError(f"--moe.memory_skew={skew:g}: must be >= 1 (1 = balanced routing; the expert-parallel degree"
                          " = every token copy on one rank)")
    check_memory_env(os.environ)


# The memory prediction's environment settings: name -> (smallest value, what it sets)
MEMORY_ENV = {
    "TITAN_MEMORY_WORKERS": (1, "processes the memory prediction runs its simulations in; 1 = this one"),
    "TITAN_MEMORY_EXACT_LIMIT": (0, "block-microbatches per rank above which large jobs are extrapolated"),
}


def check_memory_env(env) -> None:
    for name, (low, what) in MEMORY_ENV.items():
        value = env.get(name, "")
        if value and not (value.isdigit() and int(value) >= low):
            raise ConfigError(f"{name}={value}: must be an integer >= {low} ({what}); unset it for the default")


def check_model_states(cfg: JobConfig, args, world_size: int) -> None:
    """memory_budget_gib's value; then, unless this is a dry run (it reports, never refuses) or
    job.allow_over_budget is set, refuse a job whose busiest rank's parameters, gradients and
    AdamW states alone exceed the memory budget (config/model_states.py, config/memory_budget.py)."""
    from torchtitan.config import memory_budget, model_states
    from torchtitan.models.flavors import model_args

    p, m = cfg.parallelism, cfg.model
    value = p.memory_budget_gib
    if not (0 < value < math.inf or value in (0, -1)):
        raise ConfigError(f"--parallelism.memory_budget_gib={value:g}: must be > 0 (GiB per rank), 0 (the default"
                          " budget of the device) or -1 (no budget)")
    if cfg.job.dry_run or cfg.job.allow_over_budget:
        return
    ranks = memory_budget.ranks_on_this_node(world_size)
    budget = memory_budget.memory_budget(cfg, ranks, started_rank="LOCAL_RANK" in os.environ)
    if budget is None:
        return
    vocab = 0
    if not args.vocab_size:  # the flavor takes the tokenizer's vocabulary (check_inputs read it already)
        from torchtitan.components.tokenizer import Tokenizer

        vocab = Tokenizer(m.tokenizer_path).vocab_size
    run_args = model_args(m.name, m.flavor, vocab, cfg.training.seq_len, cfg.moe,
                          mtp_depth=m.mtp_depth, initial_load_path=cfg.checkpoint.initial_load_path)
    rank = model_states.busiest(model_states.job_rank_states(cfg, world_size, run_args))
    if rank.total_bytes <= budget.bytes:
        return
    gib = model_states.gib
    raise ConfigError(
        f"--model.flavor={m.flavor}: model states alone need {gib(rank.total_bytes)} GiB per rank (parameters"
        f" {gib(rank.params_bytes)}, gradients {gib(rank.grads_bytes)}, AdamW {gib(rank.optimizer_bytes)};"
        f" {rank.where()}, {world_size} rank{'s' if world_size > 1 else ''}) but the memory budget is"
        f" {gib(budget.bytes)} GiB ({budget.origin}); use more ranks or sharding (NGPU,"
        " data_parallel_shard_degree, tensor_parallel_degree, pipeline_parallel_degree), or set"
        " --parallelism.memory_budget_gib (-1: no budget)"
    )
