"""The model and its parallel layout: name and flavor, degrees against the world size and the
model's shapes (heads, experts, layers per stage), MoE and MTP keys, context and expert
parallel, and the two FSDP policies. The rules are their owners' (distributed/job_shape.py,
distributed/pipeline_layout.py, distributed/reshard_policy.py); these turn them into lines
that name the keys.
"""

import math

from torchtitan.checks.upstream_only import unknown_model_reason
from torchtitan.config.job_config import AUTO, JobConfig
from torchtitan.config.manager import ConfigError, suggest
from torchtitan.distributed.job_shape import ShapeError, degrees, pipeline_microbatches
from torchtitan.distributed.pipeline_layout import ZERO_BUBBLE, PipelineLayoutError, pipeline_layout
from torchtitan.distributed.reshard_policy import ReshardPolicyError, check_policy
from torchtitan.messages import one_line
from torchtitan.models.flavors import flavors_of
from torchtitan.models.protocol import contract_gaps
from torchtitan.models.registry import MODELS, load_model_modules


def resolve_dp_shard(cfg: JobConfig, world_size: int) -> int:
    """The data-parallel shard degree ("auto" resolved), by job_shape's rule."""
    try:
        return degrees(cfg, world_size).dp_shard
    except ShapeError as e:
        raise ConfigError(str(e)) from None


def check_model(cfg: JobConfig):
    """Model name (after importing `model.module`, which may register it) and flavor; returns
    the flavor's args."""
    m = cfg.model
    try:
        load_model_modules(m.module)
    except (ImportError, SyntaxError, ValueError) as e:
        # not importable, or it fails while importing (a syntax error, a bad register call);
        # anything else its import raises is a bug in that code and keeps its traceback
        what = one_line(e) if isinstance(e, ImportError) else f"{type(e).__name__}: {one_line(e)}"
        raise ConfigError(
            f"--model.module={m.module!r}: cannot import it ({what}); give a module that"
            " registers a model, importable from PYTHONPATH"
        ) from None
    if m.name not in MODELS:
        reason = unknown_model_reason(m.name)
        if reason:
            raise ConfigError(reason)
        raise ConfigError(
            f"--model.name: unknown model '{m.name}'{suggest(m.name, MODELS)};"
            f" choose one of {', '.join(MODELS)}"
        )
    flavors = flavors_of(m.name)
    if m.flavor not in flavors:
        raise ConfigError(
            f"--model.flavor: unknown flavor '{m.flavor}' of {m.name}{suggest(m.flavor, flavors)};"
            f" choose one of {', '.join(flavors)}"
        )
    args = flavors[m.flavor]
    gaps = contract_gaps(args)
    if gaps:  # the checks below and the planner read these of every model's args
        raise ConfigError(
            f"--model.name={m.name}: its args ({type(args).__name__}) lack {', '.join(gaps)} of"
            " torchtitan.models.protocol.ModelArgs; give them (docs/adding_a_model.md)"
        )
    if m.attn_mask not in ("auto", "causal", "block_causal"):
        raise ConfigError(f"--model.attn_mask={m.attn_mask}: choose auto, causal or block_causal")
    return args


def check_layout(cfg: JobConfig, args, world_size: int) -> int:
    """Degrees vs world size and the model's shapes (heads, experts, layers per stage);
    returns the data-parallel shard degree."""
    m, p = cfg.model, cfg.parallelism
    dp_shard = resolve_dp_shard(cfg, world_size)
    tp = p.tensor_parallel_degree
    att = args.attention
    heads_of = {"n_heads": att.n_heads, "n_kv_heads": att.n_kv_heads} if att else {}
    for key, heads in heads_of.items():
        if heads and heads % tp:
            raise ConfigError(
                f"--parallelism.tensor_parallel_degree={tp} does not divide {m.name} {m.flavor}"
                f" {key}={heads}; pick a divisor of {heads}"
            )
    check_moe(cfg, args)
    check_mtp(cfg)
    check_context_parallel(cfg)
    check_expert_parallel(cfg, args, dp_shard)
    try:
        pipeline_layout(p, args.n_layers, pipeline_microbatches(cfg))
    except (ShapeError, PipelineLayoutError) as e:
        raise ConfigError(str(e)) from None
    if (
        cfg.compile.enable
        and p.pipeline_parallel_degree > 1
        and p.pipeline_parallel_schedule in ZERO_BUBBLE
    ):
        # torch 2.13's zero-bubble schedules raise on a compiled stage module when they are built
        raise ConfigError(
            f"--compile.enable=true with --parallelism.pipeline_parallel_schedule={p.pipeline_parallel_schedule}:"
            f" torch's zero-bubble schedules ({', '.join(ZERO_BUBBLE)}) refuse compiled stages (they split"
            " each backward into input and weight passes); use 1F1B, Interleaved1F1B, GPipe or LoopedBFS,"
            " or --compile.enable=false"
        )
    return dp_shard


def check_moe(cfg: JobConfig, args) -> None:
    """The [moe] keys: only for models with experts, each within its range."""
    moe, m, shape = cfg.moe, cfg.model, args.moe
    experts = shape.n_routed_experts if shape else 0
    changed = [
        k
        for k in ("top_k", "score_func", "load_balance_coeff", "aux_loss_coeff")
        if getattr(moe, k) != AUTO
    ]
    if changed and not experts:
        raise ConfigError(
            f"--moe.{changed[0]}: model {m.name} has no experts; drop the [moe] settings"
        )
    if not experts:
        return
    if moe.top_k != AUTO and moe.top_k < 1:
        raise ConfigError(
            f"--moe.top_k={moe.top_k}: must be >= 1 (or auto for the flavor's {shape.n_activated_experts})"
        )
    routable = experts // shape.n_expert_groups * shape.n_limited_groups
    if moe.top_k != AUTO and moe.top_k > routable:
        raise ConfigError(
            f"--moe.top_k={moe.top_k} exceeds the {routable} experts a token can reach ({m.name} {m.flavor}:"
            f" {shape.n_limited_groups} of {shape.n_expert_groups} groups of {experts // shape.n_expert_groups});"
            f" pick at most {routable}"
        )
    for key in ("load_balance_coeff", "aux_loss_coeff"):
        value = getattr(moe, key)
        if value != AUTO and value < 0:
            raise ConfigError(
                f"--moe.{key}={value}: must be >= 0 (0 disables it) or auto for the flavor's value"
            )
    aux = shape.aux_loss_coeff if moe.aux_loss_coeff == AUTO else moe.aux_loss_coeff
    p = cfg.parallelism
    # Switch-style (Qwen): the statistics travel through the pipeline; sequence-wise (DeepSeek-V3):
    # not every stage reaches the loss. TP: each rank routes a chunk of the sequences; the Switch
    # statistics are summed over TP (models/common/moe.sum_over_group; the sequence-wise loss's
    # too, not yet proven by a parity case); CP: not yet.
    switch = shape.aux_loss_kind == "switch"
    what = "Switch-style" if switch else "sequence-wise"
    checks = [] if switch else [("pipeline_parallel_degree", p.pipeline_parallel_degree)]
    if not switch:
        checks.append(("tensor_parallel_degree", p.tensor_parallel_degree))
    if switch:
        checks.append(("context_parallel_degree", p.context_parallel_degree))
    bias = shape.load_balance_coeff if moe.load_balance_coeff == AUTO else moe.load_balance_coeff
    instead = (
        "the bias-based balancing stays on"
        if bias > 0
        else "and --moe.load_balance_coeff=1e-3 to balance by bias"
    )
    for key, degree in checks:
        if aux > 0 and degree > 1:
            raise ConfigError(
                f"--moe.aux_loss_coeff={aux:g} (the {what} balance loss) is not supported with"
                f" --parallelism.{key}={degree} yet; set --moe.aux_loss_coeff=0 ({instead})"
            )


def check_mtp(cfg: JobConfig) -> None:
    """Multi-token prediction: a DeepSeek-V3 feature."""
    m, t = cfg.model, cfg.training
    if m.mtp_depth < 0:
        raise ConfigError(
            f"--model.mtp_depth={m.mtp_depth}: must be >= 0 (0 = no multi-token prediction)"
        )
    if not (t.mtp_loss_weight >= 0 and math.isfinite(t.mtp_loss_weight)):
        raise ConfigError(
            f"--training.mtp_loss_weight={t.mtp_loss_weight}: must be >= 0 (0.3 in the DeepSeek-V3"
            " report)"
        )
    if m.mtp_depth == 0:
        return
    with_mtp = [
        name
        for name, entry in MODELS.items()
        if any(a.mtp_depth is not None for a in entry.flavors.values())
    ]
    if m.name not in with_mtp:
        raise ConfigError(
            f"--model.mtp_depth={m.mtp_depth}: multi-token prediction is implemented for"
            f" {', '.join(with_mtp)} only, not {m.name}; set --model.mtp_depth=0"
        )


def check_context_parallel(cfg: JobConfig) -> None:
    """Each CP rank holds two equal chunks of every sequence (one with the balancer none;
    ptrr refused); sequence parallel then splits a rank's tokens over TP."""
    p, t = cfg.parallelism, cfg.training
    cp, tp = p.context_parallel_degree, p.tensor_parallel_degree
    if cp == 1:
        return
    if p.context_parallel_load_balancer == "ptrr":
        raise ConfigError(
            "--parallelism.context_parallel_load_balancer=ptrr is FlexAttention's per-document"
            " balancer and CP here runs SDPA, not FlexAttention; use headtail (or none)"
        )
    pieces = 2 * cp if p.context_parallel_load_balancer == "headtail" else cp
    if t.seq_len % pieces:
        cut = f"2 x {cp}" if pieces > cp else f"{cp}"
        raise ConfigError(
            f"--parallelism.context_parallel_degree={cp} cuts each sequence into {cut} chunks but"
            f" --training.seq_len={t.seq_len} is not a multiple of {pieces}; pick a seq_len that is"
        )
    if tp > 1 and (t.seq_len // cp) % tp:
        raise ConfigError(
            f"--training.seq_len={t.seq_len}: a CP rank's {t.seq_len // cp} tokens do not split over"
            f" --parallelism.tensor_parallel_degree={tp} (sequence parallel); pick a seq_len that is a"
            f" multiple of {math.lcm(pieces, cp * tp)}"
        )


def check_expert_parallel(cfg: JobConfig, args, dp_shard: int) -> None:
    """EP borrows all of tp's and cp's ranks, then dp_shard's; experts split evenly over it.
    Under expert tensor parallel (etp = tp) the experts are split over tp by hidden unit
    instead, and EP borrows only cp's and dp_shard's ranks."""
    p, m = cfg.parallelism, cfg.model
    ep, tp, cp = p.expert_parallel_degree, p.tensor_parallel_degree, p.context_parallel_degree
    etp = p.expert_tensor_parallel_degree  # 1 or tp: job_shape.degrees checked it
    experts = args.moe.n_routed_experts if args.moe else 0
    if etp > 1 and not experts:
        raise ConfigError(
            f"--parallelism.expert_tensor_parallel_degree={etp}: model {m.name} has no experts;"
            " set it to 1"
        )
    takes = cp if etp > 1 else tp * cp  # the ranks EP borrows whole
    if experts and ep > 1 and cp > 1 and ep % takes:
        by = (
            "context_parallel_degree"
            if etp > 1
            else "tensor_parallel_degree x context_parallel_degree"
        )
        raise ConfigError(
            f"--parallelism.expert_parallel_degree={ep} with --parallelism.context_parallel_degree={cp}"
            f" must be a multiple of {by} = {takes}: every CP rank routes its own tokens, so EP takes"
            " all of CP"
        )
    if experts and tp > 1 and etp == 1 and ep % tp:
        raise ConfigError(
            f"--parallelism.tensor_parallel_degree={tp} with {m.name} needs --parallelism.expert_parallel_degree"
            f" a multiple of {tp} (it is {ep}): under sequence parallel each TP rank routes its own tokens"
            " and EP, which takes every TP rank, brings them to their experts"
        )
    if etp > 1:
        hidden = args.moe.moe_inter_dim
        if hidden % (8 * etp):
            raise ConfigError(
                f"--parallelism.expert_tensor_parallel_degree={etp} splits {m.name} {m.flavor}"
                f" moe_inter_dim={hidden} into slices that are not multiples of 8 (the grouped GEMM's"
                " alignment); use expert_tensor_parallel_degree=1"
            )
    if ep > 1 and not experts:
        raise ConfigError(
            f"--parallelism.expert_parallel_degree={ep}: model {m.name} has no experts; set it to 1"
        )
    if ep > 1 and dp_shard % (ep // takes):
        if etp > 1:
            what, by = ("ep / cp", "cp x ") if cp > 1 else ("ep", "")
        else:
            what, by = ("ep / (tp x cp)", "tp x cp x ") if cp > 1 else ("ep / tp", "tp x ")
        raise ConfigError(
            f"--parallelism.expert_parallel_degree={ep} takes {ep // takes} ranks from data_parallel_shard_degree"
            f"={dp_shard} ({what}), which does not divide it; pick an"
            f" expert_parallel_degree of {by}a divisor of {dp_shard}"
        )
    if ep > 1 and experts % ep:
        raise ConfigError(
            f"--parallelism.expert_parallel_degree={ep} does not divide {m.name} {m.flavor}"
            f" n_routed_experts={experts}; pick a divisor of {experts}"
        )
    if (ep > 1 or etp > 1) and dp_shard == 1 and p.data_parallel_replicate_degree > 1:
        key = "expert_parallel_degree" if ep > 1 else "expert_tensor_parallel_degree"
        raise ConfigError(
            f"--parallelism.{key}={ep if ep > 1 else etp} with DDP (data_parallel_shard_degree=1) is not"
            " supported; shard the data-parallel ranks (data_parallel_shard_degree > 1)"
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
        check_policy(
            p.reshard_after_forward, p.pipeline_parallel_degree > 1, p.pipeline_parallel_schedule
        )
    except ReshardPolicyError as e:
        raise ConfigError(str(e)) from None


def check_activation_checkpoint(cfg: JobConfig) -> None:
    """selective_ac_option: "op" or a positive integer; per_op_sac_recompute_every_nth_mm:
    0 or at least 2."""
    nth = cfg.activation_checkpoint.per_op_sac_recompute_every_nth_mm
    if nth == 1 or nth < 0:
        raise ConfigError(
            f"--activation_checkpoint.per_op_sac_recompute_every_nth_mm={nth}: use 0 (save every"
            " matmul) or n >= 2 (recompute every n-th; 2 is torchtitan's op SAC); to recompute"
            " every matmul use --activation_checkpoint.mode=full"
        )
    option = cfg.activation_checkpoint.selective_ac_option
    if cfg.activation_checkpoint.mode == "selective" and option != "op":
        if not option.isdigit() or int(option) < 1:
            raise ConfigError(
                f"--activation_checkpoint.selective_ac_option={option!r}: use 'op' or a positive"
                " integer n (checkpoint every n-th block)"
            )
