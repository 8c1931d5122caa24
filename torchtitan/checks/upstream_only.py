"""What upstream torchtitan (v0.2.2) has and this fork cannot run, each refused in one line
naming the reason and the alternative, before any process group starts. Every key upstream
has is accepted by the config (config/upstream.py); the values here are the ones that cannot
run. Torch-free.
"""

from torchtitan.config.job_config import JobConfig
from torchtitan.config.manager import ConfigError

# Upstream's models that are not part of this fork: name -> what it is.
UPSTREAM_ONLY_MODELS = {
    "llama4": "upstream's Llama 4 (MoE with chunked attention)",
    "gpt_oss": "upstream's gpt-oss (MoE with attention sinks)",
    "flux": "upstream's FLUX diffusion model",
    "llama3_ft": "upstream's fault-tolerant Llama 3 (torchft replica groups)",
    "vlm": "upstream's vision-language model",
}


def unknown_model_reason(name: str) -> str | None:
    """The refusal of an upstream-only model name (called where an unknown name is refused)."""
    if name not in UPSTREAM_ONLY_MODELS:
        return None
    return (
        f"--model.name={name}: {UPSTREAM_ONLY_MODELS[name]} is not part of this fork; train"
        " llama3, deepseek_v3 or qwen3, or register your own with --model.module"
        " (docs/adding_a_model.md)"
    )


def check_upstream_only(cfg: JobConfig) -> None:
    """Raise ConfigError for the first upstream feature that cannot run here."""
    if cfg.parallelism.expert_parallel_comm_backend == "deepep":
        raise ConfigError(
            "--parallelism.expert_parallel_comm_backend=deepep: DeepEP's CUDA kernels are not part"
            " of this fork; use standard (torch's all-to-all)"
        )
    if cfg.comm.mode == "local_tensor":
        raise ConfigError(
            "--comm.mode=local_tensor: upstream's single-process simulation of every rank's"
            " tensors is not in this fork; use --job.dry_run (plans the job and predicts every"
            " rank role's memory on a fake process group) or default"
        )
