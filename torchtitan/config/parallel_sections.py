"""The sections of how a job is split and what it recomputes or compiles: [parallelism],
[moe], [activation_checkpoint], [compile] (see job_config.py for the conventions; [quantize]
is quantize_sections.py)."""

from dataclasses import dataclass, field
from typing import Literal

AUTO = "auto"  # derive the value from the rest of the job


@dataclass
class Parallelism:
    """The parallel layout (degrees, schedule) and the FSDP reshard policy with the memory budget."""

    data_parallel_replicate_degree: int = 1
    """Replicas of the model (DDP, or HSDP's outer dimension when data_parallel_shard_degree > 1)."""

    data_parallel_shard_degree: int | Literal["auto"] = AUTO
    """Ranks the parameters are sharded over (FSDP). auto = whatever the other degrees leave
    (distributed/job_shape.degrees)."""

    tensor_parallel_degree: int = 1
    """Ranks each layer's matrices are split over (Megatron-style TP)."""

    pipeline_parallel_degree: int = 1
    """Pipeline stages the layers are split over."""

    context_parallel_degree: int = 1
    """Ranks each sequence is split over (context parallel, for long sequences): every rank
    holds 2 of 2 x CP chunks (head and tail, equal causal work), computes Q/K/V for its
    tokens and all-gathers K and V over its CP group (DeepSeek-V3: MLA's latent and RoPE
    key, 576 values per token). FSDP shards over data_parallel_shard_degree x CP; EP borrows
    all of CP (and TP) first. training.seq_len must be a multiple of 2 x CP."""

    expert_parallel_degree: int = 1
    """Ranks the routed experts are split over (models with experts only); tokens reach
    their experts by all-to-all. EP takes every TP rank (each routes its own tokens) and the
    rest from data_parallel_shard_degree (with CP: every CP rank too, then dp_shard); experts
    are FSDP-sharded over the data-parallel ranks EP did not take. It must be a multiple of
    tensor_parallel_degree x context_parallel_degree."""

    fsdp_implementation: Literal["fsdp2", "simple_fsdp"] = "fsdp2"
    """Data-parallel implementation: fsdp2 (torch fully_shard, gathers in module hooks) or
    simple_fsdp (DTensor parameters gathered by one op per FSDP unit inside its forward,
    visible to AC and torch.compile; under PP kept units are gathered once per step). Both
    shard over dp_shard, replicate over dp_replicate (HSDP / DDP)."""

    reshard_after_forward: Literal["auto", "always", "never"] = "auto"
    """FSDP: free each unit's gathered parameters after its forward (ZeRO-3) or keep them for
    backward (ZeRO-2). auto: under PP keep all (one gather per step instead of one per
    microbatch); without PP reshard every block but the last, keep norm + output; with
    a memory budget, keep units gathered only while every rank role's predicted peak stays
    under planning.memory_budget_gib (distributed/reshard_policy.resolve, the one place that decides).
    The plan is printed at start-up and written to plan.json."""

    loss_parallel: bool = True
    """With TP: keep the output logits sharded over the vocabulary and compute the loss on
    the shards (saves the all-gather of the logits)."""

    pipeline_parallel_schedule: Literal[
        "GPipe",
        "1F1B",
        "Interleaved1F1B",
        "LoopedBFS",
        "InterleavedZeroBubble",
        "ZBVZeroBubble",
        "DualPipeV",
        "PipelineScheduleMulti",
    ] = "1F1B"
    """Pipeline schedule (torch.distributed.pipelining). GPipe and 1F1B run one stage per
    rank; Interleaved1F1B, LoopedBFS and InterleavedZeroBubble several per rank (loop
    order); ZBVZeroBubble and DualPipeV exactly two per rank (V order);
    PipelineScheduleMulti runs the actions of pipeline_parallel_schedule_csv."""

    pipeline_parallel_microbatch_size: int = 1
    """Sequences per pipeline microbatch; local_batch_size must be a multiple of it
    (distributed/job_shape.pipeline_microbatches)."""

    pipeline_parallel_layers_per_stage: int | Literal["auto"] = AUTO
    """Transformer blocks per pipeline stage, counting the embedding and the output as
    first/last_stage_less_layers blocks each (upstream's rule): a number n gives
    ceil((blocks + first + last) / n) stages; auto = one stage per rank (GPipe, 1F1B) or two
    (every other schedule), the blocks dealt out as evenly as the weighted ends allow
    (distributed/pipeline_layout.py)."""

    pipeline_parallel_split_points: list[str] = field(default_factory=list)
    """Explicit stage boundaries as the first block of each later stage, e.g.
    layers.2,layers.4 (three stages); overrides pipeline_parallel_layers_per_stage."""

    pipeline_parallel_first_stage_less_layers: int = 1
    """How many blocks fewer the first pipeline stage gets, because it also runs the embedding
    (upstream's rule: the embedding counts as this many blocks). Used when the split is not
    given by split points or module_fqns_per_model_part."""

    pipeline_parallel_last_stage_less_layers: int = 1
    """How many blocks fewer the last pipeline stage gets, because it also runs the final norm,
    the output projection and the loss."""

    module_fqns_per_model_part: list[list[str]] = field(default_factory=list)
    """The pipeline split spelled out: one list of module names per stage, in order, e.g.
    [["tok_embeddings", "layers.0"], ["layers.1", "layers.2"], ["layers.3", "norm", "output"]];
    on the command line as JSON. Overrides every other split key."""

    pipeline_parallel_schedule_csv: str = ""
    """A CSV file of pipeline actions per rank (torch's schedule format: F0, B0, W0 ... one
    row per rank) run by torch's schedule runtime; needs pipeline_parallel_schedule =
    PipelineScheduleMulti (or a single-stage schedule when one stage per rank)."""

    pipeline_parallel_expert_parallel_overlap: bool = True
    """DualPipeV with EP: overlap one microbatch's expert all-to-all with another's compute
    (upstream's optimisation). Accepted; this fork runs DualPipeV without the overlap, which
    changes only the step time, never the numbers."""

    context_parallel_load_balancer: Literal["headtail", "ptrr", "none"] = "headtail"
    """How a sequence's tokens are dealt to the CP ranks: headtail (each rank holds a head and
    a tail chunk, equal causal work), none (contiguous chunks, rank 0 the least work), ptrr
    (FlexAttention's per-document balancer: refused, no CP with FlexAttention here)."""

    context_parallel_rotate_method: Literal["allgather", "alltoall"] = "allgather"
    """How CP ranks exchange keys and values: allgather (every rank gathers all K/V chunks
    before attention) or alltoall (the chunks travel rank to rank, attention accumulated
    chunk by chunk with log-sum-exp, less peak memory)."""

    expert_tensor_parallel_degree: int = 1
    """TP degree of the routed experts (upstream's ETP): 1 = experts are not split by TP (EP
    may take TP's ranks); = tensor_parallel_degree: each expert's matrices are split over the
    TP ranks as well and EP comes from the data-parallel ranks. Models with experts only."""

    expert_parallel_comm_backend: Literal["standard", "deepep"] = "standard"
    """How tokens reach their experts: standard (torch's all-to-all); deepep (DeepEP's CUDA
    kernels) is refused, the kernels are not part of this fork."""

    enable_async_tensor_parallel: bool = False
    """Async TP: overlap TP's collectives with the matmuls (torch's micro-pipeline TP over
    symmetric memory). CUDA only, needs compile.enable with "model" in compile.components;
    refused on CPU."""


@dataclass
class MoE:
    """Routing and load balancing of mixture-of-experts models."""

    top_k: int | Literal["auto"] = AUTO
    """Routed experts each token goes to (n_activated_experts); auto = the flavor's value."""

    score_func: Literal["auto", "sigmoid", "softmax"] = AUTO
    """Router affinity: sigmoid (DeepSeek-V3) or softmax (V2); auto = the flavor's choice."""

    load_balance_coeff: float | Literal["auto"] = AUTO
    """Auxiliary-loss-free balancing: after every optimizer step each MoE layer's routing
    bias moves by this much toward balance (up for experts that got fewer tokens than the
    mean over the global batch, down for busier ones); the bias only selects experts, it
    never weighs them (models/common/moe.update_expert_bias). 0 disables it; auto = the
    flavor's value."""

    aux_loss_coeff: float | Literal["auto"] = AUTO
    """Weight of the model's MoE balance loss added to the training loss (logged as aux_loss);
    0 disables it; auto = the flavor's value. DeepSeek-V3: the sequence-wise loss of its report
    (which used 1e-4; 0 in every shipped flavor; not yet with pipeline or tensor parallel).
    Qwen3: Qwen's Switch-style loss over all MoE layers of a micro-batch (0.001 in the MoE
    flavors, as published; with pipeline parallel too, not yet with tensor or context
    parallel). See models/common/moe.py."""


@dataclass
class ActivationCheckpoint:
    """What backward recomputes instead of keeping, and FSDP's gathers inside those regions."""

    mode: Literal["none", "full", "selective", "memory_budget"] = "none"
    """Recompute activations in backward: none, full (every block), selective."""

    selective_ac_option: str = "op"
    """For mode=selective: 'op' (save compute-heavy ops, recompute the rest) or an integer
    n (checkpoint every n-th block)."""

    fsdp_ac_policy: Literal["auto", "save", "recompute"] = "auto"
    """simple_fsdp only: inside each AC region, FSDP's parameter all-gathers are saved (the
    unit stays ZeRO-2 under recompute), recomputed (re-gathered in backward), or, with auto,
    saved exactly where the reshard plan keeps the unit unsharded. Recognised by process
    group, so TP/EP collectives and other ops follow the AC mode. With fsdp2 only auto is
    valid: its hooks already gather once for recompute and backward
    (distributed/activation_checkpoint.region_specs)."""

    per_op_sac_force_recompute_mm_shapes_by_fqns: list[str] = field(
        default_factory=lambda: ["moe.router.gate"]
    )
    """Selective op AC: matmuls of the shape of these nn.Linear modules (by name suffix) are
    always recomputed, never saved (e.g. the MoE router's small gate)."""

    per_op_sac_recompute_every_nth_mm: int = 0
    """Selective op AC: 0 saves every matmul's output; n >= 2 recomputes every n-th matmul of
    a block instead (counted in forward order, after the forced ones above). 2 is
    torchtitan's own op SAC policy, the one its published benchmark runs used: less
    activation memory, more recompute (docs/step_time.md)."""

    early_stop: bool = False
    """Stop a region's recompute as soon as the activations backward needs are rebuilt
    (torch.utils.checkpoint's early stop)."""

    memory_budget: float = 0.5
    """mode=memory_budget (needs compile.enable): the compiler's partitioner keeps this fraction
    of the activation memory between full recompute (0) and none (1)."""

    visualize_memory_budget_pareto: bool = False
    """mode=memory_budget: write the partitioner's runtime vs memory trade-off curve as SVG to
    <dump_folder>/memory_budget_pareto."""

    preserve_rng_state: bool = False
    """Save and restore the RNG state around each recompute so that dropout-like ops recompute
    the same values (torch.utils.checkpoint's preserve_rng_state). Default false here: the
    models have no random ops, saving and restoring the RNG costs time for nothing."""

    determinism_check: str = "default"
    """torch.utils.checkpoint's check that the recompute matches the forward: default (shape,
    dtype and device of every saved tensor) or none."""

    debug: bool = False
    """Record the ops of each recompute and print them when the determinism check fails
    (torch.utils.checkpoint's debug mode; slow)."""


@dataclass
class Compile:
    """torch.compile of each transformer block."""

    enable: bool = False
    """Compile each transformer block with torch.compile (one graph per block kind, static shapes;
    docs/compile.md). Refused with a zero-bubble pipeline schedule, which torch 2.13 cannot run
    on compiled stages."""

    backend: str = "inductor"
    """torch.compile backend: inductor (fused kernels), aot_eager (no codegen, for debugging)."""

    components: list[Literal["model", "loss"]] = field(default_factory=lambda: ["model", "loss"])
    """What compile.enable compiles: model (each transformer block), loss (the cross-entropy
    over the logits)."""

    graph_passes: Literal["", "auto_bucketing", "transformer_block_bucketing"] = ""
    """simple_fsdp + compile: inductor passes that bucket FSDP's all-gathers and reduce-scatters
    and overlap them with compute: auto_bucketing (inductor chooses the buckets),
    transformer_block_bucketing (one bucket per block); empty: none (upstream's SimpleFSDP
    extension key)."""
