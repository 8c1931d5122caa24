"""Upstream torchtitan's spellings (v0.2.2) of keys this fork names differently.

A torchtitan user's TOML and command line run here unchanged: each key below is upstream's
current name for one of ours, so it is accepted silently (no deprecation line; renamed keys
of earlier releases are in manager.DEPRECATED_KEYS and do warn). `--help` and docs/config.md
list them under "upstream spellings". Torch-free and imports nothing of ours.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Spelling:
    target: str  # our "section.key"
    meaning: str  # one line for --help and docs/config.md
    upstream_type: Any = None  # the upstream value's type when it is not ours (with to_ours)
    to_ours: Callable[[Any], Any] | None = None  # upstream's value -> ours


def _negate(value: bool) -> bool:
    return not value


def _default_is_auto(value: Any) -> Any:
    return "auto" if isinstance(value, str) and value.strip() == "default" else value


UPSTREAM_SPELLINGS: dict[tuple[str, str], Spelling] = {
    ("parallelism", "disable_loss_parallel"): Spelling(
        "parallelism.loss_parallel",
        "true = loss_parallel false (upstream states the opposite switch)",
        bool,
        _negate,
    ),
    ("parallelism", "fsdp_reshard_after_forward"): Spelling(
        "parallelism.reshard_after_forward",
        "default|always|never; default is auto (the per-unit plan)",
        None,
        _default_is_auto,
    ),
    ("debug", "seed"): Spelling("training.seed", "the run's random seed"),
    ("debug", "deterministic"): Spelling(
        "training.deterministic", "deterministic algorithms and fixed kernel choices"
    ),
    ("comm", "init_timeout_seconds"): Spelling(
        "comm.timeout_seconds",
        "collective timeout up to the end of the first step (train_timeout_seconds after it)",
    ),
    ("experimental", "custom_import"): Spelling(
        "model.module", "a module imported before the model is built (it may register one)"
    ),
}

# Upstream's model names that are one of ours in another layout: prefix -> (key, value) set.
MODEL_PREFIXES = {"simple_fsdp.": ("fsdp_implementation", "simple_fsdp")}

# Modules upstream's own TOMLs and suite name in job.custom_config_module: the keys they add
# are keys of this config already (compile.graph_passes; fault_tolerance's DiLoCo keys), so
# naming them imports nothing.
BUILT_IN_EXTENSIONS = {
    "torchtitan.experiments.simple_fsdp.job_config": "compile.graph_passes",
    "torchtitan.components.ft.config": "the fault_tolerance keys",
    "torchtitan.components.ft.config.job_config": "the fault_tolerance keys",
}


def spelling_lines() -> list[str]:
    """`--upstream.key  ->  ours: meaning` lines for --help and docs/config.md."""
    return [
        f"--{section}.{key} -> --{s.target}: {s.meaning}"
        for (section, key), s in UPSTREAM_SPELLINGS.items()
    ]


def apply_upstream_values(cfg: Any, warnings: list[str]) -> None:
    """Upstream values that mean one of our settings elsewhere: model.name=simple_fsdp.llama3
    is llama3 with parallelism.fsdp_implementation=simple_fsdp (silently, upstream's own
    spelling); comm.mode=fake_backend plans on a fake process group, which is job.dry_run
    here (with a line saying so)."""
    for prefix, (key, value) in MODEL_PREFIXES.items():
        if cfg.model.name.startswith(prefix):
            cfg.model.name = cfg.model.name[len(prefix) :]
            setattr(cfg.parallelism, key, value)
    if cfg.comm.mode == "fake_backend":
        cfg.job.dry_run = True
        warnings.append(
            "'comm.mode = fake_backend' runs this fork's dry run (--job.dry_run): the job is"
            " planned on a fake process group and every rank role's memory is predicted"
        )
