"""The sections of what a job writes and how long it waits: [checkpoint], [comm], [metrics],
[profiling] (see job_config.py for the conventions)."""

from dataclasses import dataclass, field
from typing import Literal

AUTO = "auto"  # derive the value from the rest of the job


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

    async_mode: Literal["disabled", "async", "async_with_pinned_mem"] = "disabled"
    """disabled: a save stops training until every rank's files are written. async: training
    stops only while each rank copies its state into host memory (staging); DCP writes the copy
    from a background thread during the next steps, over a gloo group of its own. A save waits
    for the previous one; the last save and a preemption save are synchronous; a save counts
    (becomes step-N) only once all of it is written. Memory: every rank keeps a staged copy of
    its parameters and optimizer states from the first save on (pinned host memory on CUDA, the
    same memory as training on CPU; the memory prediction counts it)."""

    initial_load_model_only: bool = True
    """initial_load_path holds only model weights (true), or a full checkpoint whose optimizer,
    lr scheduler and data position are loaded too (false)."""

    initial_load_in_hf: bool = False
    """initial_load_path is a Hugging Face model folder (config.json + safetensors). Recognised
    by its config.json anyway; setting it makes a folder without one an error."""

    initial_load_in_hf_quantized: bool = False
    """initial_load_path holds quantized Hugging Face weights (e.g. DeepSeek-V3's fp8 blocks):
    refused, only unquantized weights are read."""

    exclude_from_loading: list[str] = field(default_factory=list)
    """Parts of a checkpoint not loaded on resume, e.g. lr_scheduler,dataloader,optimizer (each
    starts fresh); the model is always loaded."""

    enable_first_step_checkpoint: bool = False
    """Also save a checkpoint after the first step."""

    load_only: bool = False
    """Load checkpoints but never save one."""

    enable_ft_dataloader_checkpoints: bool = True
    """With fault_tolerance: each replica group writes its data position after every step to
    small files of its own (<dump_folder>/ft/replica_<id>/, in the background) and the full
    checkpoint holds none, so a group that restarts resumes its own data exactly; false: no
    data position is kept under fault tolerance (a restarted group reads its rows anew)."""


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

    train_timeout_seconds: int | Literal["auto"] = AUTO
    """Collective timeout from the second step on (upstream's key; the first step, with
    compilation and warm-up, keeps timeout_seconds); auto = timeout_seconds."""

    trace_buf_size: int = 20000
    """CUDA: entries of NCCL's flight recorder (the last collectives of each rank, dumped when
    a collective times out or a hang is reported); 0 = off."""

    save_traces_folder: str = "comm_traces"
    """Folder under dump_folder for the flight recorder's dumps."""

    save_traces_file_prefix: str = "rank_"
    """File name prefix of each rank's flight recorder dump."""

    mode: Literal["default", "fake_backend", "local_tensor"] = "default"
    """default: real collectives. fake_backend: one process plans the job on a fake process
    group of world size NGPU (this fork's job.dry_run). local_tensor: refused."""


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

    disable_color_printing: bool = False
    """Plain log lines without terminal colours (the log here is never coloured: accepted for
    upstream's files)."""

    save_tb_folder: str = "tb"
    """TensorBoard folder, under dump_folder."""

    save_for_all_ranks: bool = False
    """Every rank writes its own TensorBoard folder (<save_tb_folder>/rank_N) instead of rank 0
    only."""


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

    profiler_active: int = 1
    """Steps the profiler records per trace (torch.profiler.schedule's active)."""

    profiler_warmup: int = 3
    """Steps the profiler runs without recording before each trace (schedule's warmup)."""
