"""The shape of a job, each rule stated once: parallel degrees (dp_shard = what the others
leave), global batch, gradient-accumulation steps and pipeline microbatches.

Torch-free: the config check (before any process group) and the owners at run time
(ParallelDims, the trainer, the data checks, the build path) all call these functions, so
a rule cannot drift between the check and the run. Errors are one line naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torchtitan.config.job_config import JobConfig


class ShapeError(ValueError):
    """A degree or batch setting that cannot work; the text names the key and the fix."""


@dataclass(unsafe_hash=True)  # never changed once made: hashable (the layout search's keys)
class Degrees:
    """Parallel degrees of a job whose world size they multiply to."""

    dp_replicate: int
    dp_shard: int
    tp: int
    pp: int
    ep: int
    world_size: int
    cp: int = 1
    etp: int = 1  # expert tensor parallel: 1, or tp (each expert's matrices split over TP)

    @property
    def dp(self) -> int:
        """Ranks that see different data (replicas x shards)."""
        return self.dp_replicate * self.dp_shard

    @property
    def dp_cp(self) -> int:
        """Ranks whose local losses make the global mean (every CP rank holds its own tokens)."""
        return self.dp * self.cp

    @property
    def fsdp_shard(self) -> int:
        """Ranks FSDP shards dense parameters over: dp_shard x cp."""
        return self.dp_shard * self.cp

    @property
    def ep_from_dp_shard(self) -> int:
        """How many of dp_shard's ranks EP takes (the rest of EP comes from cp, and from tp
        unless ETP splits the experts over tp instead)."""
        if self.ep == 1:
            return 1
        return self.ep // (self.cp if self.etp > 1 else self.tp * self.cp)

    @property
    def experts_split(self) -> bool:
        """Whether routed experts are split over ranks (by EP, ETP or both)."""
        return self.ep > 1 or self.etp > 1

    @property
    def expert_shards(self) -> int:
        """Ranks one expert stack is split over: ep (by expert) x etp (by hidden unit)."""
        return self.ep * self.etp


def degrees(cfg: JobConfig, world_size: int) -> Degrees:
    """The [parallelism] degrees, dp_shard "auto" resolved to what the others leave."""
    p = cfg.parallelism
    named = {
        "data_parallel_replicate_degree": p.data_parallel_replicate_degree,
        "tensor_parallel_degree": p.tensor_parallel_degree,
        "pipeline_parallel_degree": p.pipeline_parallel_degree,
        "expert_parallel_degree": p.expert_parallel_degree,
        "context_parallel_degree": p.context_parallel_degree,
    }
    for key, value in named.items():
        if value < 1:
            raise ShapeError(f"--parallelism.{key}={value}: must be >= 1")
    etp, tp = p.expert_tensor_parallel_degree, p.tensor_parallel_degree
    if etp not in (1, tp):
        raise ShapeError(
            f"--parallelism.expert_tensor_parallel_degree={etp}: must be 1 (experts not split by TP)"
            f" or tensor_parallel_degree={tp} (each expert split over the TP ranks)"
        )
    cp = p.context_parallel_degree
    others = (
        p.data_parallel_replicate_degree
        * p.tensor_parallel_degree
        * p.pipeline_parallel_degree
        * cp
    )
    shard = p.data_parallel_shard_degree
    if shard == "auto":
        if world_size % others:
            raise ShapeError(
                f"world size {world_size} is not divisible by data_parallel_replicate_degree x "
                f"tensor_parallel_degree x pipeline_parallel_degree"
                f"{' x context_parallel_degree' if cp > 1 else ''} = {others}; change the degrees or NGPU"
            )
        shard = world_size // others
    elif shard < 1:
        raise ShapeError(
            f"--parallelism.data_parallel_shard_degree={shard}: must be >= 1 or auto (the rest)"
        )
    elif shard * others != world_size:
        raise ShapeError(
            f"parallel degrees multiply to {shard * others} (replicate {p.data_parallel_replicate_degree}"
            f" x shard {shard}{f' x cp {cp}' if cp > 1 else ''} x tp {p.tensor_parallel_degree}"
            f" x pp {p.pipeline_parallel_degree})"
            f" but the world size is {world_size}; make them multiply to {world_size}"
            f" or set --parallelism.data_parallel_shard_degree=auto"
        )
    return Degrees(
        p.data_parallel_replicate_degree,
        shard,
        p.tensor_parallel_degree,
        p.pipeline_parallel_degree,
        p.expert_parallel_degree,
        world_size,
        cp,
        etp,
    )


@dataclass(frozen=True)
class BatchShape:
    """Rows per optimizer step and how they are cut."""

    global_batch: int  # rows per optimizer step over every data-parallel rank
    accum_steps: int  # forward/backward passes (local batches) per rank and step
    microbatches: int  # pipeline microbatches per local batch (1 without PP)


def pipeline_microbatches(cfg: JobConfig) -> int:
    """Microbatches per local batch under pipeline parallel (1 without it)."""
    t, p = cfg.training, cfg.parallelism
    if p.pipeline_parallel_degree == 1:
        return 1
    mb = p.pipeline_parallel_microbatch_size
    if mb < 1 or t.local_batch_size % mb:
        raise ShapeError(
            f"--training.local_batch_size={t.local_batch_size} does not split into microbatches of"
            f" --parallelism.pipeline_parallel_microbatch_size={mb}; make it a multiple"
        )
    return t.local_batch_size // mb


def replica_groups(cfg: JobConfig) -> int:
    """Replica groups of a fault-tolerant job (each a launch of its own with `dp` data-parallel
    ranks; the global batch spans them all); 1 without fault tolerance."""
    f = cfg.fault_tolerance
    return max(1, f.group_size) if f.enable else 1


def global_batch(cfg: JobConfig, dp: int) -> int:
    """Rows per optimizer step: training.global_batch_size, or ("auto") one local batch per
    data-parallel rank (of every replica group). Unchecked: batch_shape checks it against the
    degrees."""
    t = cfg.training
    dp *= replica_groups(cfg)
    return t.global_batch_size if t.global_batch_size != "auto" else t.local_batch_size * dp


def batch_shape(cfg: JobConfig, dp: int) -> BatchShape:
    """global_batch_size ("auto": one local batch per data-parallel rank), accumulation and PP
    microbatches, for `dp` data-parallel ranks (in each replica group, under fault tolerance)."""
    t = cfg.training
    groups = replica_groups(cfg)
    per_step = t.local_batch_size * dp * groups
    if t.global_batch_size != "auto" and (
        t.global_batch_size < per_step or t.global_batch_size % per_step
    ):
        raise ShapeError(
            f"--training.global_batch_size={t.global_batch_size} must be a positive multiple of"
            f" local_batch_size x data-parallel degree = {t.local_batch_size} x {dp}"
            + (f" x {groups} replica groups" if groups > 1 else "")
            + f" = {per_step} (or auto)"
        )
    rows = global_batch(cfg, dp)
    return BatchShape(rows, rows // per_step if per_step > 0 else 0, pipeline_microbatches(cfg))
