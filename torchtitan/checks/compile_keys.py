"""Upstream's activation-checkpoint keys, compile.graph_passes and async TP, checked before
launch (torch-free): each refusal is one line naming the key and the fix.

What the keys do is distributed/activation_checkpoint.py's (configure_checkpointing) and
distributed/compile.py's (configure_compile_passes); the limits stated here are theirs:
- torch.utils.checkpoint's debug mode refuses any selective policy ("debug=True is
  incompatible with non-default context_fn"), and torch.compile and SimpleFSDP always give
  the region one;
- SimpleFSDP here gathers each FSDP unit with ONE all-gather inside an opaque op
  (torchtitan::simple_fsdp_gather) and reduce-scatters it once, and each block compiles as
  its own graph: inductor's bucketing pass finds no all-gather to merge (measured, torch
  2.13: the forward graph holds only the opaque op, the backward one reduce-scatter), so
  one bucket per block (transformer_block_bucketing) is what runs, and auto_bucketing has
  nothing to choose;
- async TP is torch's micro-pipeline TP over symmetric memory, which exists for CUDA only.
"""

import importlib.util

from torchtitan import hardware
from torchtitan.config.job_config import JobConfig
from torchtitan.config.manager import ConfigError

DETERMINISM_CHECKS = ("default", "none")  # torch.utils.checkpoint's (2.13)
NEEDS_MODEL_COMPILE = 'set --compile.enable=true with "model" in --compile.components'


def model_compiled(cfg: JobConfig) -> bool:
    return cfg.compile.enable and "model" in cfg.compile.components


def on_cpu(cfg: JobConfig) -> bool:
    """The job trains on CPU: training.device=cpu, or auto on a machine where nvidia-smi lists
    no GPU (the trainer's own choice, torch.cuda.is_available, made torch-free)."""
    device = cfg.training.device
    return device == "cpu" or (device == "auto" and not hardware.gpu_names())


def check_compile_keys(cfg: JobConfig) -> None:
    """Raise ConfigError for the first problem among these keys."""
    check_ac_upstream_keys(cfg)
    check_graph_passes(cfg)
    check_async_tp(cfg)


def check_ac_upstream_keys(cfg: JobConfig) -> None:
    ac = cfg.activation_checkpoint
    if ac.mode == "memory_budget" and not model_compiled(cfg):
        raise ConfigError(
            "--activation_checkpoint.mode=memory_budget: the compiler's partitioner chooses what"
            f" to recompute, so the blocks must be compiled: {NEEDS_MODEL_COMPILE}"
        )
    if not 0.0 <= ac.memory_budget <= 1.0:
        raise ConfigError(
            f"--activation_checkpoint.memory_budget={ac.memory_budget:g}: must be between 0"
            " (recompute everything) and 1 (the partitioner's default choice)"
        )
    if ac.visualize_memory_budget_pareto:
        if ac.mode != "memory_budget":
            raise ConfigError(
                "--activation_checkpoint.visualize_memory_budget_pareto=true: only with"
                " --activation_checkpoint.mode=memory_budget (the curve is the partitioner's)"
            )
        if importlib.util.find_spec("matplotlib") is None:
            raise ConfigError(
                "--activation_checkpoint.visualize_memory_budget_pareto=true: torch draws the"
                " curve with matplotlib, which is not installed: pip install matplotlib"
            )
    if ac.determinism_check not in DETERMINISM_CHECKS:
        raise ConfigError(
            f"--activation_checkpoint.determinism_check={ac.determinism_check!r}: use one of"
            f" {', '.join(DETERMINISM_CHECKS)}"
        )
    if ac.debug and ac.mode != "none" and not _plain_full_ac(cfg):
        raise ConfigError(
            "--activation_checkpoint.debug=true: torch's checkpoint debug mode runs only in"
            " regions without a selective policy: use --activation_checkpoint.mode=full (or"
            " selective with an integer selective_ac_option) with"
            " --parallelism.fsdp_implementation=fsdp2 and --compile.enable=false"
        )


def _plain_full_ac(cfg: JobConfig) -> bool:
    """Every region is torch's plain full checkpoint (no context_fn): full AC of whole blocks,
    FSDP2 (SimpleFSDP regions name its gathers in a policy), eager (compiled regions always
    run through a policy)."""
    ac = cfg.activation_checkpoint
    full = ac.mode == "full" or (ac.mode == "selective" and ac.selective_ac_option != "op")
    return full and cfg.parallelism.fsdp_implementation == "fsdp2" and not model_compiled(cfg)


def check_graph_passes(cfg: JobConfig) -> None:
    passes = cfg.compile.graph_passes
    if not passes:
        return
    if cfg.parallelism.fsdp_implementation != "simple_fsdp" or not model_compiled(cfg):
        raise ConfigError(
            f"--compile.graph_passes={passes}: a SimpleFSDP + compile pass: set"
            f" --parallelism.fsdp_implementation=simple_fsdp and"
            f" {NEEDS_MODEL_COMPILE.removeprefix('set ')}"
        )
    if passes == "auto_bucketing":
        raise ConfigError(
            "--compile.graph_passes=auto_bucketing: nothing for inductor to bucket here:"
            " SimpleFSDP gathers each FSDP unit with one all-gather inside an opaque op and each"
            " block compiles as its own graph; use transformer_block_bucketing (one bucket per"
            " block, the layout it runs) or leave the key empty"
        )


def check_async_tp(cfg: JobConfig) -> None:
    p = cfg.parallelism
    if not p.enable_async_tensor_parallel:
        return
    if on_cpu(cfg):
        raise ConfigError(
            "--parallelism.enable_async_tensor_parallel=true: not on CPU: torch's micro-pipeline"
            " TP runs over symmetric memory, which is CUDA-only; set it to false"
        )
    if not model_compiled(cfg):
        raise ConfigError(
            "--parallelism.enable_async_tensor_parallel=true: async TP is a compiler pass:"
            f" {NEEDS_MODEL_COMPILE}"
        )
    if p.tensor_parallel_degree <= 1:
        raise ConfigError(
            "--parallelism.enable_async_tensor_parallel=true: needs"
            " --parallelism.tensor_parallel_degree > 1 (there are no TP collectives to overlap)"
        )
