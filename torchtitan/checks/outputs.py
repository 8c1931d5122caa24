"""Checks of what a run writes and how it ends: the dump and checkpoint folders (and the
checkpoint a run would load, read on disk), the Hugging Face export, the [comm] timeouts and
the hang watchdog, Weights & Biases. Part of check_job: no process group, one line per error.
"""

import os

from torchtitan.checkpoint.files import (
    LOADABLE_PARTS,
    CheckpointError,
    hf_export_path,
    start_point,
)
from torchtitan.config.job_config import AUTO, JobConfig
from torchtitan.config.manager import ConfigError
from torchtitan.resilience import faults
from torchtitan.resilience.timeouts import (
    REPORT_INTERVALS,
    longest_hang_timeout,
    shortest_collective_timeout,
)
from torchtitan.training.model_args import run_model_args


def check_outputs(cfg: JobConfig, world_size: int, global_batch: int) -> None:
    """Dump folder, checkpoint folder, timeouts and the hang watchdog."""
    if os.path.isfile(cfg.job.dump_folder):
        raise ConfigError(
            f"--job.dump_folder: '{cfg.job.dump_folder}' is a file; give a folder path"
        )
    check_checkpoint(cfg, world_size, global_batch)
    check_comm(cfg)


def check_comm(cfg: JobConfig) -> None:
    """The [comm] timeouts, and the fault-injection setting of the failure tests."""
    c = cfg.comm
    for key in ("timeout_seconds", "checkpoint_timeout_seconds"):
        if getattr(c, key) < 1:
            raise ConfigError(f"--comm.{key}={getattr(c, key)}: must be >= 1")
    if c.train_timeout_seconds != AUTO and c.train_timeout_seconds < 1:
        raise ConfigError(
            f"--comm.train_timeout_seconds={c.train_timeout_seconds}: must be >= 1 or auto"
        )
    timeout = shortest_collective_timeout(c)
    hang, longest = c.hang_timeout_seconds, longest_hang_timeout(timeout)
    which = "timeout_seconds" if timeout == c.timeout_seconds else "train_timeout_seconds"
    if hang != AUTO and (hang < 0 or hang > longest):
        allowed = f"1..{longest}" if longest >= 1 else "none"
        raise ConfigError(
            f"--comm.hang_timeout_seconds={hang}: must be auto, 0 (off) or seconds ({allowed} with"
            f" --comm.{which}={timeout}: a hang report takes up to {REPORT_INTERVALS} heartbeat"
            " intervals more, and must come before the collective timeout ends the job)"
        )
    try:
        faults.parse(os.environ.get(faults.ENV, ""))
    except ValueError as e:
        raise ConfigError(f"{e}; unset it outside the failure tests") from None


WANDB_DEFAULT_HOST = "https://api.wandb.ai"


def wandb_offline() -> bool:
    """Whether wandb.init will neither log in nor upload: WANDB_MODE offline (or its old name
    dryrun) or disabled, or WANDB_DISABLED set true."""
    mode = os.environ.get("WANDB_MODE", "").strip().lower()
    disabled = os.environ.get("WANDB_DISABLED", "").strip().lower() in ("true", "1", "yes")
    return mode in ("offline", "dryrun", "disabled") or disabled


def wandb_credentials() -> str | None:
    """Where wandb would find an API key, looked up as wandb does it but without importing it or
    touching the network: WANDB_API_KEY (or WANDB_IDENTITY_TOKEN_FILE), else the netrc entry of
    the W&B host (WANDB_BASE_URL, default api.wandb.ai) in $NETRC, ~/.netrc or ~/_netrc. None:
    not logged in."""
    import netrc

    for var in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE"):
        if os.environ.get(var):
            return var
    host = wandb_host()
    if os.environ.get("NETRC"):
        paths = [os.path.expanduser(os.environ["NETRC"])]
    else:
        paths = [os.path.expanduser("~/.netrc"), os.path.expanduser("~/_netrc")]
    for path in paths:
        if not os.path.isfile(path):
            continue
        try:
            entry = netrc.netrc(path).authenticators(host)
        except (netrc.NetrcParseError, OSError):
            return None  # wandb warns and finds no key in it either
        return path if entry and entry[2] else None
    return None


def check_wandb(cfg: JobConfig) -> None:
    """--metrics.enable_wandb: the package is there and, online, a login (wandb.init would
    otherwise prompt or fail on rank 0 only, after the process group is up)."""
    if not cfg.metrics.enable_wandb:
        return
    import importlib.util

    try:
        found = importlib.util.find_spec("wandb") is not None
    except (ImportError, ValueError):  # a broken or half-imported package
        found = False
    if not found:
        raise ConfigError(
            "--metrics.enable_wandb: the wandb package is not installed; pip install -e '.[wandb]'"
        )
    if not wandb_offline() and wandb_credentials() is None:
        raise ConfigError(
            f"--metrics.enable_wandb: not logged in to W&B ({wandb_host()}): no WANDB_API_KEY and no netrc entry;"
            " run `wandb login`, set WANDB_API_KEY, or set WANDB_MODE=offline"
        )


def wandb_host() -> str:
    """The W&B server's host name: WANDB_BASE_URL's, default api.wandb.ai."""
    from urllib.parse import urlsplit

    url = os.environ.get("WANDB_BASE_URL") or WANDB_DEFAULT_HOST
    return urlsplit(url).netloc or url


def check_checkpoint(cfg: JobConfig, world_size: int, global_batch: int) -> None:
    """The [checkpoint] keys, and the checkpoint a run would load, checked on disk."""
    c = cfg.checkpoint
    ckpt = os.path.join(cfg.job.dump_folder, c.folder)
    if (c.enable or c.create_seed_checkpoint) and os.path.isfile(ckpt):
        raise ConfigError(f"--checkpoint.folder: '{ckpt}' is a file; give a folder path")
    if c.keep_latest_k < 0:
        raise ConfigError(
            f"--checkpoint.keep_latest_k={c.keep_latest_k}: must be >= 0 (0 keeps all)"
        )
    if c.load_step != AUTO and c.load_step < 0:
        raise ConfigError(
            f"--checkpoint.load_step={c.load_step}: must be >= 0, or auto for the newest"
        )
    check_initial_load(cfg)
    if not c.enable and not c.create_seed_checkpoint:
        for key, value, default in (
            ("load_step", c.load_step, AUTO),
            ("last_save_model_only", c.last_save_model_only, False),
            ("async_mode", c.async_mode, "disabled"),
            ("load_only", c.load_only, False),
            ("enable_first_step_checkpoint", c.enable_first_step_checkpoint, False),
        ):
            if value != default:
                raise ConfigError(
                    f"--checkpoint.{key}={value} has no effect without --checkpoint.enable=true; enable checkpointing or drop it"
                )
    if c.load_only:
        for key, value in (
            ("last_save_in_hf", c.last_save_in_hf),
            ("enable_first_step_checkpoint", c.enable_first_step_checkpoint),
        ):
            if value:
                raise ConfigError(
                    f"--checkpoint.{key} writes a save, --checkpoint.load_only=true forbids every save; drop one of them"
                )
    if c.create_seed_checkpoint:
        if world_size != 1:
            raise ConfigError(
                f"--checkpoint.create_seed_checkpoint runs on one rank, not {world_size}: use NGPU=1 (no"
                " parallelism); then train any layout from the same folder"
            )
        if os.path.isdir(ckpt) and any(n.startswith("step-") for n in os.listdir(ckpt)):
            raise ConfigError(
                f"--checkpoint.create_seed_checkpoint: '{ckpt}' already holds checkpoints; give an empty"
                " --checkpoint.folder or --job.dump_folder (nothing is overwritten)"
            )
        return
    if cfg.job.dry_run:  # plans only; loads nothing
        return
    check_hf_export(cfg)
    try:  # what the run would start from, decided as the checkpoint manager decides it
        start_point(
            ckpt,
            c,
            cfg.model.name,
            flavor=cfg.model.flavor,
            args=run_model_args(cfg),
            global_batch=global_batch,
            hf_assets_path=cfg.model.hf_assets_path,
        )
    except CheckpointError as e:
        raise ConfigError(str(e)) from None


def check_initial_load(cfg: JobConfig) -> None:
    """What a run loads, before any folder is read: initial_load_in_hf(_quantized), the
    model-only switch, and exclude_from_loading's names (upstream's keys)."""
    c = cfg.checkpoint
    if c.initial_load_in_hf_quantized:
        raise ConfigError(
            "--checkpoint.initial_load_in_hf_quantized: quantized Hugging Face weights (e.g."
            " DeepSeek-V3's fp8 blocks) are not read here; give a folder of unquantized (bf16 or"
            " fp32) weights and drop the key"
        )
    if c.initial_load_in_hf and not c.initial_load_model_only:
        raise ConfigError(
            "--checkpoint.initial_load_in_hf: a Hugging Face folder holds weights only, so"
            " --checkpoint.initial_load_model_only=false cannot load its training state; set it true"
        )
    if c.initial_load_in_hf and not (c.initial_load_path or cfg.model.hf_assets_path):
        raise ConfigError(
            "--checkpoint.initial_load_in_hf: no folder to read; set --checkpoint.initial_load_path"
            " (or --model.hf_assets_path) to the Hugging Face model folder"
        )
    for name in c.exclude_from_loading:
        if name == "model":
            raise ConfigError(
                "--checkpoint.exclude_from_loading=model: the model is always loaded; exclude"
                f" any of {', '.join(LOADABLE_PARTS)}, or start without the checkpoint"
            )
        if name not in LOADABLE_PARTS:
            raise ConfigError(
                f"--checkpoint.exclude_from_loading: unknown part '{name}'; the parts are"
                f" {', '.join(LOADABLE_PARTS)}"
            )
    full_initial = c.initial_load_path and not c.initial_load_model_only
    if c.exclude_from_loading and not (c.enable or full_initial):
        raise ConfigError(
            f"--checkpoint.exclude_from_loading={','.join(c.exclude_from_loading)} has no effect"
            " without --checkpoint.enable=true (or --checkpoint.initial_load_model_only=false); enable"
            " checkpointing or drop it"
        )


def check_hf_export(cfg: JobConfig) -> None:
    """last_save_in_hf: the model has a converter and the target folder is new."""
    if not cfg.checkpoint.last_save_in_hf:
        return
    from torchtitan.models.hf.converters import hf_converter

    try:
        converter = hf_converter(cfg.model.name)
    except ValueError as e:
        raise ConfigError(f"--checkpoint.last_save_in_hf: {e}") from None
    refusal = getattr(
        converter, "export_refusal", None
    )  # what a model's Hugging Face layout cannot hold
    reason = refusal(run_model_args(cfg)) if refusal is not None else None
    if reason:
        raise ConfigError(f"--checkpoint.last_save_in_hf: {reason}")
    target = hf_export_path(cfg.job.dump_folder, cfg.training.steps)
    # Without checkpoints a rerun trains from scratch and would have to overwrite the folder; with
    # them it resumes, and the export is skipped with a line if the folder is already there.
    if os.path.exists(target) and not cfg.checkpoint.enable:
        raise ConfigError(
            f"--checkpoint.last_save_in_hf: '{target}' already exists (nothing is overwritten); move it"
            " away or pick another --job.dump_folder"
        )
