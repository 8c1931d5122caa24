"""Every configuration key of a training job, with its default and its meaning.

The string literal under each field is its documentation: `--help` prints it, docs/config.md
is rendered from it (scripts/render_config_docs.py), and the config manager uses the
annotations to check types and enum choices. A docstring says what the key does and names the
function that applies its rule. This module must not import torch so that config errors are
reported in a fraction of a second, and imports nothing else of ours.

One spelling per idea: "auto" is "derive it from the rest of the job" in every key that can,
0 is "off" where a key can be switched off, "none" is "no limit" (config/manager.py accepts
the older spellings, see LEGACY_VALUES there).
"""

from dataclasses import dataclass, field
from typing import Literal

AUTO = "auto"  # derive the value from the rest of the job


@dataclass
class Job:
    """The run itself: its config file, where it writes, and the dry run."""

    config_file: str = ""
    """TOML file to load; CLI overrides are applied on top of it."""

    dump_folder: str = "./outputs"
    """Folder for everything a run writes: metrics.jsonl, TensorBoard logs, plan, checkpoints."""

    description: str = ""
    """Free text shown in the first log line."""

    print_config: bool = False
    """Print the fully resolved configuration at start-up."""

    dry_run: bool = False
    """Plan only: one process with a fake process group of world size NGPU builds the model
    on meta, applies the whole parallel plan, prints it with the predicted peak memory of
    every rank role, writes plan.json and exits, without allocating weights."""


@dataclass
class Model:
    """Which model, which size, which tokenizer."""

    name: str = "llama3"
    """Model family, a name registered in models/registry.py (llama3, deepseek_v3, qwen3, or one a
    model.module registers)."""

    module: str = ""
    """Python module(s) to import before the model is looked up, comma-separated: a package of
    your own that registers its model with torchtitan.models.registry.register (see
    docs/adding_a_model.md). The checks and every worker import it; it must be importable
    (PYTHONPATH) and should not import torch at import time."""

    flavor: str = "debugmodel"
    """Size preset of the model family (e.g. debugmodel, 8B, 70B, 405B for llama3)."""

    tokenizer_path: str = ""
    """HF tokenizer.json file (or a folder holding one). Empty = the small BPE tokenizer
    bundled in torchtitan/assets (built by scripts/build_tokenizer.py)."""

    attn_mask: str = "causal"
    """causal: a token attends to every earlier token of its window. block_causal: only to
    those of its own document (documents are told apart by their BOS tokens; a window may
    start mid-document), as long-context recipes train."""

    mtp_depth: int = 0
    """Multi-token prediction (DeepSeek-V3 report, section 2.2): sequential MTP modules after
    the last block, module k predicting the token k+2 ahead; they share the embeddings and the
    output head. 0 = off; DeepSeek-V3 used 1. Models whose args have mtp_depth only (deepseek_v3);
    under pipeline parallel the MTP modules sit on the last stage."""


@dataclass
class Training:
    """Steps, batch, sequence length, numerics, device and the training data."""

    steps: int = 10
    """Number of optimizer steps to train."""

    local_batch_size: int = 8
    """Sequences per data-parallel rank per forward/backward (micro-step)."""

    global_batch_size: int | Literal["auto"] = AUTO
    """Sequences per optimizer step over all data-parallel ranks. auto = local_batch_size x
    data-parallel degree; a multiple of that enables gradient accumulation
    (distributed/job_shape.batch_shape)."""

    seq_len: int = 256
    """Tokens per sequence."""

    max_norm: float = 1.0
    """Gradient-norm clipping threshold (over all shards and stages); 0 disables clipping."""

    mtp_loss_weight: float = 0.3
    """Weight of the multi-token-prediction loss (lambda in the DeepSeek-V3 report): the
    trained objective is loss + mtp_loss_weight x mtp_loss, mtp_loss being the mean over the
    MTP depths of their cross entropy. Used only with --model.mtp_depth > 0."""

    seed: int = 0
    """Seed for weight init. Init is layout independent (every parallel layout starts from
    the same weights); the data order is fixed by the dataset, not the seed."""

    deterministic: bool = False
    """Use deterministic algorithms (slower) so that reruns give bitwise-identical losses."""

    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where to train: auto picks CUDA + NCCL when a GPU is present, else CPU + gloo."""

    mixed_precision_param: Literal["auto", "bfloat16", "float32"] = "auto"
    """Dtype of parameters in forward/backward (FSDP all-gathers in it). auto = bfloat16 on
    CUDA, float32 on CPU."""

    mixed_precision_reduce: Literal["float32", "bfloat16"] = "float32"
    """Dtype of gradient reduction across data-parallel ranks."""

    dataset: str = "pydoc"
    """Dataset: 'pydoc' (embedded, Python's own documentation, no download), a folder made by
    scripts/tokenize_dataset.py (pre-tokenized: no tokenizer work at run time), a local
    .jsonl/.json/.txt file (indexed: each rank reads only its documents), .arrow file or
    save_to_disk folder, a .parquet/.csv file or data folder, or a Hugging Face hub name
    (streamed shard by shard). How it is read, and when documents are read more than once
    the fix, is on the start line (docs/data.md)."""

    dataset_mix: list[str] = field(default_factory=list)
    """A weighted mixture instead of `dataset`: entries 'dataset:weight', e.g.
    ["web.jsonl:0.7", "code_tokens:0.3"], each dataset in any form `dataset` takes. Weights
    are shares of tokens (normalised), interleaved deterministically (data/mixture.py); the
    tokens each source gave are logged (tokens_seen/<name>). A source that runs dry starts
    its next epoch, and the log says so. dataset_split/text_field/config_name apply to all."""

    dataloader_workers: int | Literal["auto"] = AUTO
    """Loader processes per rank that read and tokenise ahead of the trainer (torch
    DataLoader workers; each owns whole rows of the batch). auto = 2 on CUDA, 0 on CPU (the
    training thread reads). The count used divides local_batch_size x accumulation steps
    suitably and is on the start line; the data position saved does not depend on it."""

    dataset_split: str = "train"
    """Split of an HF dataset to read."""

    dataset_text_field: str = "text"
    """Column holding the document text in an HF dataset."""

    dataset_config_name: str = ""
    """Config (subset) name of an HF hub dataset, if it has several."""


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
    ] = "1F1B"
    """Pipeline schedule (torch.distributed.pipelining). GPipe and 1F1B run one stage per
    rank; Interleaved1F1B, LoopedBFS and InterleavedZeroBubble several per rank (loop
    order); ZBVZeroBubble and DualPipeV exactly two per rank (V order)."""

    pipeline_parallel_microbatch_size: int = 1
    """Sequences per pipeline microbatch; local_batch_size must be a multiple of it
    (distributed/job_shape.pipeline_microbatches)."""

    pipeline_parallel_layers_per_stage: int | Literal["auto"] = AUTO
    """Transformer blocks per pipeline stage. auto = split the blocks evenly over one stage
    per rank (GPipe, 1F1B), two (ZBVZeroBubble, DualPipeV), or the fewest >= 2 per rank that
    divide the blocks evenly (the other multi-stage schedules; distributed/pipeline_layout.py)."""

    pipeline_parallel_split_points: list[str] = field(default_factory=list)
    """Explicit stage boundaries as the first block of each later stage, e.g.
    layers.2,layers.4 (three stages); overrides pipeline_parallel_layers_per_stage."""


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
class Optimizer:
    """AdamW."""

    name: Literal["AdamW"] = "AdamW"
    """Optimizer class."""

    lr: float = 8e-4
    """Peak learning rate."""

    eps: float = 1e-8
    """AdamW epsilon."""

    beta1: float = 0.9
    """AdamW beta1."""

    beta2: float = 0.95
    """AdamW beta2."""

    weight_decay: float = 0.1
    """Decoupled weight decay."""

    implementation: Literal["auto", "fused", "foreach"] = "auto"
    """AdamW's kernels: fused (one kernel for every tensor of a group; CUDA's fastest), foreach
    (a few multi-tensor kernels), or auto = fused on CUDA, foreach elsewhere. Same math; the
    last bits of the update may differ between the two."""


@dataclass
class LRScheduler:
    """Warmup, then a flat phase and a decay."""

    warmup_steps: int = 2
    """Steps of linear warmup from near zero up to the peak lr."""

    decay_ratio: float = 1.0
    """Fraction of the steps after warmup spent decaying (the rest stays at peak lr)."""

    decay_type: Literal["linear", "cosine"] = "linear"
    """Shape of the decay."""

    min_lr_factor: float = 0.0
    """Final lr as a fraction of the peak lr."""


@dataclass
class ActivationCheckpoint:
    """What backward recomputes instead of keeping, and FSDP's gathers inside those regions."""

    mode: Literal["none", "full", "selective"] = "none"
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


@dataclass
class Compile:
    """torch.compile of each transformer block."""

    enable: bool = False
    """Compile each transformer block with torch.compile (one graph per block kind, static shapes;
    docs/compile.md). Refused with a zero-bubble pipeline schedule, which torch 2.13 cannot run
    on compiled stages."""

    backend: str = "inductor"
    """torch.compile backend: inductor (fused kernels), aot_eager (no codegen, for debugging)."""


@dataclass
class Checkpoint:
    """Saving, resuming, starting from other weights, exporting to Hugging Face."""

    enable: bool = False
    """Save checkpoints (torch.distributed.checkpoint) and resume from the latest one."""

    folder: str = "checkpoint"
    """Checkpoint folder, relative to job.dump_folder."""

    interval: int = 500
    """Save every this many steps (and at the last step)."""

    keep_latest_k: int = 0
    """Keep only the newest k full checkpoints, deleting older ones after each save; 0 keeps
    all. Seed and model-only checkpoints are never deleted."""

    load_step: int | Literal["auto"] = AUTO
    """Step to resume from: auto = the most recently saved complete checkpoint in the folder
    (checkpoint/files.resolve_resume); N = exactly step-N (an error if it is missing or incomplete). Use it to go back past a
    bad one; the checkpoints saved after that are then newer than the abandoned later steps."""

    initial_load_path: str = ""
    """Weights that start this run when its own checkpoint folder holds none: a checkpoint
    folder (e.g. another run's <dump>/checkpoint/step-N; only the weights are read) or a
    Hugging Face model folder (config.json + *.safetensors, with or without an index, e.g.
    a published Llama 3.1 download), recognised by its config.json. Hugging Face weights are
    converted (names, RoPE row order) and checked against the flavor's shapes."""

    last_save_model_only: bool = False
    """At the last step save only the model weights (in export_dtype), for export or
    fine-tuning, instead of a full resumable checkpoint."""

    export_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Dtype of the weights written by last_save_model_only and last_save_in_hf."""

    last_save_in_hf: bool = False
    """After the last step also write the weights as a Hugging Face model folder
    (config.json, safetensors with an index, tokenizer.json) in <dump_folder>/hf/step-N,
    loadable by transformers' LlamaForCausalLM. Works without checkpoint.enable; an existing
    folder is never overwritten. scripts/convert_hf.py exports a saved checkpoint the same way."""

    create_seed_checkpoint: bool = False
    """Initialise the model on one rank (NGPU=1, no parallelism), save it as step-0 (weights
    only) and exit; every layout that then trains from this folder starts from these weights."""

    async_mode: Literal["disabled", "async"] = "disabled"
    """disabled: a save stops training until every rank's files are written. async: training
    stops only while each rank copies its state into host memory (staging); DCP writes the copy
    from a background thread during the next steps, over a gloo group of its own. A save waits
    for the previous one; the last save and a preemption save are synchronous; a save counts
    (becomes step-N) only once all of it is written. Memory: every rank keeps a staged copy of
    its parameters and optimizer states from the first save on (pinned host memory on CUDA, the
    same memory as training on CPU; the memory prediction counts it)."""


@dataclass
class Comm:
    """How long collectives, checkpoint I/O and a silent rank may take."""

    timeout_seconds: int = 300
    """Longest a collective may wait for the other ranks before the run fails. A rank that
    died or hangs makes every other rank exit non-zero within this time instead of hanging.
    (On CUDA, NCCL's watchdog aborts the process at the timeout, without an error line.)"""

    checkpoint_timeout_seconds: int = 1800
    """Longest a checkpoint save or load may wait for the slowest rank's file I/O. Separate
    from timeout_seconds so that writing a large checkpoint to a slow file system does not
    fail a healthy run."""

    hang_timeout_seconds: int | Literal["auto"] = AUTO
    """A rank that passes no progress point of the training loop (data read, forward/backward,
    metrics ...) for this long reports a hang, before the collective timeout ends the job
    without saying who was where: the stuck ranks write their Python stacks (and NCCL's flight
    recorder on CUDA) to <dump_folder>/hang/, the lowest live one prints one line naming the
    rank(s) that stopped - also a frozen rank, silent in the per-rank heartbeats of the
    rendezvous store - and where the others wait, then the job exits 1. Paused during
    checkpoint saves, validation, compilation and the first step; raised to 1.5 x the longest
    step when the steps are longer. auto = 60% of timeout_seconds; 0 = off; at most what
    leaves time for the report before timeout_seconds (resilience/timeouts.py)."""


@dataclass
class Metrics:
    """What each step logs and where."""

    log_freq: int = 1
    """Log every this many steps (console, TensorBoard, metrics.jsonl)."""

    enable_tensorboard: bool = True
    """Write TensorBoard event files under <dump_folder>/tb."""

    enable_wandb: bool = False
    """Log to Weights & Biases (rank 0) the scalars TensorBoard gets, with the job config as the
    run config. Needs the wandb extra (pip install -e '.[wandb]') and, unless WANDB_MODE is
    offline or disabled, a login (WANDB_API_KEY or `wandb login`). Project WANDB_PROJECT
    (default "torchtitan"), entity WANDB_ENTITY, run name job.description or the dump folder's
    name; the run's files go under <dump_folder>/wandb."""

    comm_stats: bool = False
    """Count collectives per step (rank 0): adds `comm` (counts) and `comm_bytes` to each
    metrics.jsonl record, keyed "<forward|backward|other>/<collective>/<mesh dim>";
    compiled code included. Adds Python overhead to every op: for measurement runs."""

    held_for_backward: bool = False
    """Measure the bytes one micro-batch's forward leaves alive for backward (saved
    activations, checkpoint caches, gathered parameters kept) and log them as
    held_for_backward_bytes. Eager mode only (compiled kernels allocate out of sight)."""

    cpu_memory_peak: bool = False
    """On CPU, measure each step's peak of allocated tensor bytes (the analogue of CUDA's
    max_memory_allocated) with the torch profiler's allocator events and log it as
    memory_peak_allocated_gib; every rank also writes its peaks to <dump_folder>/memory/rank<r>.jsonl
    (as every CUDA run does). Off by default: it slows the step, and only one profiler
    runs at a time, so it cannot be combined with profiling.enable_profiling."""


@dataclass
class Hardware:
    """The machine a job is predicted for and measured on (torchtitan/hardware.py, the one GPU
    table; planning/step_time/model.py): a named profile, single values of which the keys
    below override."""

    profile: Literal[
        "auto",
        "local",
        "h100_sxm",
        "h100_pcie",
        "h100_nvl",
        "h100_grand_teton",
        "h800",
        "h800_pcie",
        "h200",
        "h200_nvl",
        "gh200",
        "gh200_144gb",
        "a100_80gb",
        "a100_40gb",
        "a100_pcie_80gb",
        "a100_pcie_40gb",
        "a800",
        "a800_pcie",
        "b200",
        "gb200",
        "l40s",
        "l40",
        "l4",
        "a10",
    ] = AUTO
    """auto: `local` for a CPU job; for a GPU job the profile the visible GPUs' exact name
    chooses (nvidia-smi; the names each profile lists in torchtitan/hardware.py, never a guess:
    a GPU it does not list gets no step-time prediction and one line naming it and this key);
    h100_sxm when no GPU is visible (a dry run of a GPU job on a CPU machine: a default part,
    not a guess about a GPU that is there). `local` is this machine as a short micro-benchmark
    finds it (GEMM, memory-bound ops, attention, op overhead, gloo collectives), cached in
    ~/.cache/torchtitan by the first dry run; the named profiles are the entries of the one
    hardware table (torchtitan/hardware.py: datasheet figures with their sources), which both
    the predicted and the measured MFU read."""

    gpus_per_node: int | Literal["auto"] = AUTO
    """Ranks per node sharing the fast intra-node links (NVLink; PCIe cards: the server's PCIe);
    auto = the profile's (8 for most GPU profiles, 1 for gh200, 72 for gb200's NVLink domain)."""

    peak_tflops: float | Literal["auto"] = AUTO
    """Dense bf16 peak TFLOPS of one device, the one figure both the predicted and the
    measured MFU divide by (the profile's other dtypes, fp32's for fp32 jobs, scaled alike);
    auto = the profile's datasheet figure: that of `profile`, or (auto) of the GPU's name (a GPU
    the table does not hold: no MFU; none on CPU: no measured MFU)."""

    hbm_gbps: float | Literal["auto"] = AUTO
    """Device memory bandwidth in GB/s; auto = the profile's."""

    intra_node_gbps: float | Literal["auto"] = AUTO
    """Achievable collective bus bandwidth per rank inside a node, GB/s; auto = the profile's."""

    inter_node_gbps: float | Literal["auto"] = AUTO
    """Achievable collective bus bandwidth per rank across nodes (its NIC), GB/s; auto = the profile's."""

    gemm_efficiency: float | Literal["auto"] = AUTO
    """Fraction of peak FLOPS a large GEMM reaches; auto = the profile's."""

    clock_factor: float | Literal["auto"] = AUTO
    """Sustained fraction of the boost clock the compute units hold (a power cap lowers it),
    scaling every peak FLOPS figure; auto = the profile's (1, or h100_grand_teton's calibrated
    value: docs/step_time.md)."""


@dataclass
class Planning:
    """What is decided before launch from the simulated step (planning/): the memory budget a
    job must fit, the routing skew it is planned for, and the dry run's searches (the largest
    fit, the fastest layout, the nearby choices). The machine they are predicted for is
    [hardware]."""

    memory_budget_gib: float | Literal["auto", "none"] = AUTO
    """Most GiB of tensor memory one rank may use at its peak (the dry run's prediction:
    parameters, gradients, optimizer states, gathered parameters, activations, buffers).
    auto: the device's memory (CUDA: minus a margin; CPU: the available memory shared by the
    ranks of this node, less what a process needs beyond its tensors; planning/memory/budget.py).
    none: no budget. Jobs over it are refused (see allow_over_budget)."""

    memory_skew: float = 1.0
    """Routing skew the memory prediction plans for: the busiest expert-parallel rank receives
    memory_skew times its balanced share of token copies (1 = balanced; the EP degree = every
    token to one rank, the worst case, always reported beside the planned figure)."""

    fit: Literal["", "local_batch_size", "seq_len", "layout"] = ""
    """With dry_run: search the largest training.local_batch_size (or seq_len) whose predicted
    peak fits planning.memory_budget_gib, per activation-checkpoint mode (gradient
    accumulation steps held fixed, so the global batch grows with the local batch).
    layout: search the fastest layout for NGPU devices on the hardware profile (degrees,
    pipeline schedule and microbatch, AC mode, reshard policy, local batch under the job's
    global batch; planning/search/search.py), print the top 10 with their overrides and write
    the best to <dump_folder>/best_layout.toml."""

    layout_candidates: int = 10
    """With fit = layout: how many layouts (best first by the cheap estimate) are simulated in
    full, besides the layout as configured; each costs about one dry run of the job
    (docs/step_time.md has the measured times). More finds more, slower."""

    layout_seconds: float = 420.0
    """With fit = layout: no full simulation starts that could end after this many seconds of
    them (judged by the longest so far; the layout as configured is simulated first), so a
    search of the largest jobs stays within minutes; the search then ranks those done."""

    nearby: bool = True
    """With dry_run and a hardware profile: also predict the choices next to the job (the AC
    modes on either side, reshard never / always, one microbatch more or fewer, compile
    switched) and print what each would gain in step time and cost in memory; one more
    simulation per choice (false skips them). Nothing about the job's own plan changes."""

    allow_over_budget: bool = False
    """Train even when a rank role's predicted peak exceeds memory_budget_gib
    (by default the job stops before the first step and prints changes that would fit)."""


@dataclass
class Validation:
    """Held-out loss during training."""

    enable: bool = False
    """Measure held-out loss and perplexity (no update) every `freq` steps and after the
    last step; logged as validation_loss / validation_perplexity (console, metrics.jsonl,
    TensorBoard). The validation batches come from a loader of their own, read at the first
    measurement and kept (the same batches each time, data/validation.py); the training
    stream is never touched."""

    dataset: str = "pydoc"
    """Same forms as training.dataset. 'pydoc' with split 'validation' is the embedded
    held-out set: docstrings of Python's standard library, which the training split (the
    documentation topics) does not contain."""

    dataset_split: str = "validation"
    """Split to read (a local file or folder has only 'train')."""

    dataset_text_field: str = "text"
    """Column holding the document text."""

    dataset_config_name: str = ""
    """Config (subset) name of an HF hub dataset, if it has several."""

    per_source: list[str] = field(default_factory=list)
    """Held-out datasets scored each on its own besides `dataset`, e.g. one per source of
    training.dataset_mix: entries 'name=dataset' (or just the dataset: named after its file),
    each in any form training.dataset takes, logged as validation_loss/<name> and
    validation_perplexity/<name>. text_field/config_name apply to all; dataset_split too,
    except to a local file (it has only 'train')."""

    freq: int = 100
    """Validate after every this many steps (and after the last step)."""

    steps: int = 4
    """Global batches per measurement (each training.global_batch_size x seq_len tokens,
    laid out like a training step)."""

    at_start: bool = True
    """Also validate before the first step (logged as step 0): the untrained baseline."""


@dataclass
class Profiling:
    """Traces and memory snapshots of chosen steps."""

    enable_profiling: bool = False
    """Record torch.profiler traces (CPU and, on GPU, CUDA activity, with shapes and stacks)
    of one step every profile_freq steps; each rank writes a Chrome trace (open it in
    chrome://tracing or https://ui.perfetto.dev)."""

    save_traces_folder: str = "profile_traces"
    """Folder for the traces, relative to job.dump_folder: <folder>/iteration_N/rankR_trace.json."""

    profile_freq: int = 10
    """Trace the step whose number is a multiple of this (the steps just before it warm the
    profiler up)."""

    enable_memory_snapshot: bool = False
    """CUDA only: record the CUDA caching allocator's history and write a snapshot (open it at
    https://pytorch.org/memory_viz) every profile_freq steps, and on an out-of-memory error.
    On CPU one line says it is CUDA-only and the run goes on."""

    save_memory_snapshot_folder: str = "memory_snapshot"
    """Folder for the snapshots, relative to job.dump_folder: <folder>/iteration_N/rankR_memory_snapshot.pickle."""


@dataclass
class JobConfig:
    """Every section of a job, in the order --help and docs/config.md show them."""

    job: Job = field(default_factory=Job)
    model: Model = field(default_factory=Model)
    training: Training = field(default_factory=Training)
    parallelism: Parallelism = field(default_factory=Parallelism)
    moe: MoE = field(default_factory=MoE)
    optimizer: Optimizer = field(default_factory=Optimizer)
    lr_scheduler: LRScheduler = field(default_factory=LRScheduler)
    activation_checkpoint: ActivationCheckpoint = field(default_factory=ActivationCheckpoint)
    compile: Compile = field(default_factory=Compile)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    comm: Comm = field(default_factory=Comm)
    metrics: Metrics = field(default_factory=Metrics)
    planning: Planning = field(default_factory=Planning)
    hardware: Hardware = field(default_factory=Hardware)
    validation: Validation = field(default_factory=Validation)
    profiling: Profiling = field(default_factory=Profiling)
