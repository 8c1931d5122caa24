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

from torchtitan.config.output_sections import AUTO, Checkpoint, Comm, Metrics, Profiling
from torchtitan.config.parallel_sections import ActivationCheckpoint, Compile, MoE, Parallelism
from torchtitan.config.planning_sections import Hardware, MemoryEstimation, Planning
from torchtitan.config.quantize_sections import (
    Float8GroupedMM,
    Float8Linear,
    MXGroupedMM,
    MXLinear,
    Quantize,
    QuantizedGroupedMM,
    QuantizedLinear,
)


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

    save_config_file: str = ""
    """Write the fully resolved configuration (every key, after TOML and overrides) as TOML to
    <dump_folder>/<this file name> at start-up; empty: don't (upstream's key)."""

    custom_config_module: str = ""
    """A Python module whose `JobConfig` dataclass extends this one: its new sections and keys
    are accepted like ours (TOML, --section.key, --help), keys of existing sections are added
    to them (config/extensions.py). The upstream modules naming keys this config has already
    (SimpleFSDP's compile.graph_passes, the fault-tolerance extension) import nothing."""


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

    attn_mask: Literal["auto", "causal", "block_causal"] = AUTO
    """causal: a token attends to every earlier token of its window. block_causal: only to
    those of its own document (documents are told apart by their BOS tokens; a window may
    start mid-document), as long-context recipes train. auto: the flavor's (block_causal for
    the flex / varlen attention flavors, e.g. debugmodel_flex_attn; causal otherwise)."""

    mtp_depth: int = 0
    """Multi-token prediction (DeepSeek-V3 report, section 2.2): sequential MTP modules after
    the last block, module k predicting the token k+2 ahead; they share the embeddings and the
    output head. 0 = off; DeepSeek-V3 used 1. Models whose args have mtp_depth only (deepseek_v3);
    under pipeline parallel the MTP modules sit on the last stage."""

    hf_assets_path: str = ""
    """Folder holding tokenizer.json (and, for a Hugging Face checkpoint, config.json), upstream's
    key: when tokenizer_path is empty the tokenizer is <hf_assets_path>/tokenizer.json; empty:
    the project's own tokenizer. Upstream's example value ./tests/assets/tokenizer ships here."""

    converters: list[str] = field(default_factory=list)
    """Model converters applied to the model on meta, before it is split and parallelized:
    quantize.linear.float8 (upstream's older spelling: float8) trains the linear layers in
    float8 ([quantize.linear.float8], torchao). Refused in one line: quantize.grouped_mm.float8
    (the routed experts: no CPU kernel, the CUDA path not in this fork yet) and the MX
    converters (quantize.linear.mx / mx, quantize.grouped_mm.mx)."""

    print_after_conversion: bool = False
    """Log the model's module tree after it is built and converted (rank 0)."""


@dataclass
class DataLoader:
    """The data loader's worker processes (torchdata StatefulDataLoader's options)."""

    num_workers: int | Literal["auto"] = AUTO
    """Processes that read and tokenize ahead of the step: auto = 2 on CUDA (the GPU's thread
    never tokenizes), 0 on CPU (read on the training thread; two cores are the budget)."""

    persistent_workers: bool = False
    """Keep the worker processes alive between passes over the data (num_workers > 0)."""

    pin_memory: bool = False
    """Put each batch in page-locked host memory for a faster copy to the GPU (CUDA only;
    ignored on CPU)."""

    prefetch_factor: int | Literal["auto"] = AUTO
    """Batches each worker reads ahead (num_workers > 0); auto = torch's default (2)."""


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

    dataset_split: str = "train"
    """Split of an HF dataset to read."""

    dataset_text_field: str = "text"
    """Column holding the document text in an HF dataset."""

    dataset_config_name: str = ""
    """Config (subset) name of an HF hub dataset, if it has several."""

    dataset_path: str = ""
    """Where a named dataset (c4_test, c4, ...) is read from instead of its default location
    (upstream's key): a local file or folder in the same format; empty: the default."""

    enable_cpu_offload: bool = False
    """FSDP2: keep parameters, gradients and optimizer states in host memory and step the
    optimizer there (torch's CPUOffloadPolicy); each unit's parameters are copied to the device
    for its forward and backward. Saves device memory at the cost of host-device copies."""

    dtype: Literal["float32", "bfloat16"] = "float32"
    """Parameter dtype when no FSDP mixed precision applies (upstream's key): bfloat16 trains
    in bf16 throughout, only on jobs without data-parallel sharding; with FSDP use
    mixed_precision_param."""

    gc_freq: int = 50
    """Python's garbage collector runs every this many steps (on every rank at once) instead of
    whenever it likes, so no rank stalls the others mid-step; 0: Python's own schedule."""

    gc_debug: bool = False
    """Collect garbage after every step and log what the collector found (slow; to find
    reference cycles)."""

    dataloader: DataLoader = field(default_factory=DataLoader)
    """The training data loader's worker options ([training.dataloader])."""


@dataclass
class Optimizer:
    """AdamW, or Muon for the hidden matrices and AdamW for the rest (training/muon.py)."""

    name: Literal["AdamW", "Adam", "Muon", "muon"] = "AdamW"
    """Optimizer class. Muon: Muon for the hidden matrices (attention projections, MLPs, and
    each routed expert's matrices, a 3-D stack orthogonalized matrix by matrix), AdamW with
    the keys below for the rest (embeddings, output layer, norms, routers, biases); the split
    is printed at start (muon_params / adamw_params move parameters by name)."""

    lr: float = 8e-4
    """Peak learning rate (with Muon: AdamW's, for the parameters Muon does not take)."""

    eps: float = 1e-8
    """AdamW epsilon."""

    beta1: float = 0.9
    """AdamW beta1."""

    beta2: float = 0.95
    """AdamW beta2."""

    weight_decay: float = 0.1
    """Decoupled weight decay."""

    implementation: Literal["auto", "fused", "foreach", "for-loop"] = "auto"
    """AdamW's kernels: fused (one kernel for every tensor of a group; CUDA's fastest), foreach
    (a few multi-tensor kernels), or auto = fused on CUDA, foreach elsewhere. Same math; the
    last bits of the update may differ between the two."""

    muon_lr: float = 1e-3
    """Muon's peak learning rate (torch.optim.Muon's default; the schedule scales it as lr),
    before the per-matrix adjustment (muon_adjust_lr_fn)."""

    muon_momentum: float = 0.95
    """Muon's momentum (an exponential moving average of the gradients)."""

    muon_nesterov: bool = True
    """Muon's Nesterov update (the gradient moved toward the momentum by muon_momentum)."""

    muon_weight_decay: float = 0.1
    """Muon's decoupled weight decay (multiplied by the unadjusted lr)."""

    muon_ns_steps: int = 5
    """Newton-Schulz iterations orthogonalizing each matrix's update."""

    muon_ns_coefficients: list[float] = field(default_factory=lambda: [3.4445, -4.775, 2.0315])
    """The quintic's (a, b, c) of each Newton-Schulz iteration (Keller Jordan's, torch's)."""

    muon_eps: float = 1e-7
    """Floor of the Frobenius norm each update is divided by before the iterations."""

    muon_adjust_lr_fn: Literal["original", "match_rms_adamw"] = "original"
    """Muon's lr per matrix of global shape (rows, cols): original = lr x sqrt(max(1, rows /
    cols)); match_rms_adamw = lr x 0.2 x sqrt(max(rows, cols)) (Moonshot's: AdamW's lr and
    weight decay carry over)."""

    ns_dtype: Literal["bfloat16", "float32"] = "bfloat16"
    """Precision of the Newton-Schulz iterations: bfloat16 (torch's) or float32. Sharded
    matrices also travel to their owners in it (the iterations' first step is that cast)."""

    muon_orthogonalize: Literal["owner", "every_rank"] = "owner"
    """Where each sharded matrix is orthogonalized (training/muon_owners.py). owner: the
    matrices are dealt round-robin over the ranks that shard them; an all_to_all brings each
    owner its matrices' shards, it iterates, a second all_to_all returns the shards (each rank
    iterates on 1/n of the matrices, and moves 2(n-1)/n of its shards instead of gathering n-1).
    every_rank: every rank gathers every matrix whole and iterates on all of them (no second
    exchange; the simplest form, for comparison). Unsharded matrices (DDP, whole local experts)
    iterate where they are in either."""

    muon_params: list[str] = field(default_factory=list)
    """Parameter name patterns (fnmatch, e.g. "layers.*.attention.wq.weight") Muon takes
    whatever the default rule says; each must match a matrix (2-D, or a 3-D stack of them)."""

    adamw_params: list[str] = field(default_factory=list)
    """Parameter name patterns left to AdamW though the default rule gives them to Muon."""

    early_step_in_backward: bool = False
    """Step the optimizer for each parameter inside its gradient hook, as soon as its gradient
    is ready, so no rank holds every gradient at once. Refused with PP, EP and fault
    tolerance, as upstream does, and with gradient accumulation. Gradient clipping cannot
    apply (no global norm exists before a parameter steps): with max_norm > 0 it trains
    unclipped, as upstream does, and says so in one warning line."""


@dataclass
class LRScheduler:
    """Warmup, then a flat phase and a decay."""

    warmup_steps: int = 2
    """Steps of linear warmup from near zero up to the peak lr."""

    decay_ratio: float = 1.0
    """Fraction of the steps after warmup spent decaying (the rest stays at peak lr)."""

    decay_type: Literal["linear", "sqrt", "cosine"] = "linear"
    """Shape of the decay."""

    min_lr_factor: float = 0.0
    """Final lr as a fraction of the peak lr."""

    total_steps: int | Literal["auto"] = AUTO
    """Length of the schedule in steps: auto = training.steps; a larger value keeps the lr of a
    longer run when a job trains only part of it (upstream's key)."""


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

    dataset_path: str = ""
    """Where the named validation dataset is read from instead of its default location."""

    local_batch_size: int | Literal["auto"] = AUTO
    """Sequences per rank in a validation step; auto = training.local_batch_size."""

    seq_len: int | Literal["auto"] = AUTO
    """Tokens per validation sequence; auto = training.seq_len."""

    dataloader: DataLoader = field(default_factory=DataLoader)
    """The validation data loader's worker options ([validation.dataloader])."""


@dataclass
class FaultTolerance:
    """Replica-group fault tolerance with torchft ([fault_tolerance]; training/fault_tolerance.py,
    docs/reliability.md): the job runs as group_size launches of the same layout (replica
    groups, the replicate dimension), averaged every step over the groups alive, or every
    sync_steps (semi_sync_method: LocalSGD, DiLoCo); a lost group does not stop the others,
    and one that restarts heals from a live peer. Needs the
    optional extra (pip install -e '.[ft]') and a lighthouse (TORCHFT_LIGHTHOUSE;
    scripts/ft_local.py starts one)."""

    enable: bool = False
    """Train as one replica group of group_size (this launch is replica_id)."""

    process_group: str = "gloo"
    """torchft's process group between the replica groups: gloo, or nccl between GPU groups."""

    process_group_timeout_ms: int = 10000
    """How long a collective between the groups (and a checkpoint transfer to a healing group)
    may take before the step is given up (not committed) and the quorum re-formed, in ms."""

    replica_id: int = 0
    """This replica group's id, 0..group_size-1: it reads the global batch's rows of its id."""

    group_size: int = 0
    """Number of replica groups (the global batch is split over group_size x each group's
    data-parallel ranks)."""

    min_replica_size: int = 1
    """Fewest replica groups a step needs to be committed (1: any group alone trains on)."""

    semi_sync_method: str = ""
    """Semi-synchronous training between replica groups (training/semi_sync.py): local_sgd
    (the weights averaged every sync_steps) or diloco (the pseudo-gradients averaged and an
    outer optimizer stepped every sync_steps); empty: every step's gradients averaged."""

    sync_steps: int = 5
    """Steps between synchronisations (semi_sync_method); a multiple of num_fragments."""

    should_quantize: bool = False
    """Quantize the pseudo-gradients before their all-reduce (semi_sync_method)."""

    fragment_sync_delay: int = 0
    """Inner steps before blocking on a fragment's synchronisation (Streaming DiLoCo's tau)."""

    fragment_update_alpha: float = 0.0
    """Mix of local and global parameters after a fragment syncs (0: the global ones)."""

    module_fqns_per_model_fragment: list[list[str]] = field(default_factory=list)
    """Module names of each model fragment, one list per fragment (DiLoCo)."""

    num_fragments: int = 1
    """Fragments the model is split into (DiLoCo; Streaming DiLoCo when > 1): without
    module_fqns_per_model_fragment, contiguous runs of the transformer blocks."""

    outer_lr: float = 0.7
    """DiLoCo's outer optimizer (SGD over the averaged pseudo-gradients): its learning rate
    (upstream hardcodes 0.7, the DiLoCo paper's)."""

    outer_momentum: float = 0.9
    """DiLoCo's outer SGD momentum (upstream: 0.9)."""

    outer_nesterov: bool = True
    """DiLoCo's outer SGD with Nesterov momentum (upstream: true)."""


@dataclass
class Debug:
    """Debug switches ([debug]; upstream's seed and deterministic are training.seed and
    training.deterministic here)."""

    deterministic_warn_only: bool = False
    """With deterministic: warn instead of failing at an op without a deterministic kernel."""

    moe_force_load_balance: bool = False
    """Route tokens to experts round-robin instead of by score, so every expert gets the same
    load (to measure the balanced case)."""


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
    quantize: Quantize = field(default_factory=Quantize)
    memory_estimation: MemoryEstimation = field(default_factory=MemoryEstimation)
    fault_tolerance: FaultTolerance = field(default_factory=FaultTolerance)
    debug: Debug = field(default_factory=Debug)


__all__ = [
    "AUTO",
    "ActivationCheckpoint",
    "Checkpoint",
    "Comm",
    "Compile",
    "DataLoader",
    "Debug",
    "FaultTolerance",
    "Float8GroupedMM",
    "Float8Linear",
    "Hardware",
    "JobConfig",
    "LRScheduler",
    "MXGroupedMM",
    "MXLinear",
    "MemoryEstimation",
    "Metrics",
    "Model",
    "MoE",
    "Optimizer",
    "Parallelism",
    "Planning",
    "Profiling",
    "Quantize",
    "QuantizedGroupedMM",
    "QuantizedLinear",
    "Training",
    "Validation",
]
