"""A job being planned or built, as one value: its config, its model on meta (with the
registered spec and the args it was built from), its parallel degrees and the device type
it targets, and what follows from them, derived once (the batch shape, the pipeline
microbatches and split). The build path (training/build.py), the simulation, the memory and
step-time predictions and the layout search take it whole instead of re-deriving those
from the config at every layer; a planner's candidate job is `with_config` of it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import torch
from torch import nn

from torchtitan.distributed.job_shape import BatchShape, Degrees, batch_shape, pipeline_microbatches
from torchtitan.distributed.pipeline_layout import PipelineLayout, pipeline_layout
from torchtitan.dtypes import DTYPES
from torchtitan.models.common.float8 import convert_model
from torchtitan.models.registry import load_model_modules
from torchtitan.models.train_spec import TrainSpec, get_train_spec
from torchtitan.training.model_args import run_model_args

if TYPE_CHECKING:
    from torchtitan.config.job_config import JobConfig


@dataclass
class MetaModel:
    """The job's model on meta, its registered spec and the args it was built from."""

    spec: TrainSpec
    model: nn.Module
    args: object


def model_on_meta(cfg: JobConfig, args=None) -> MetaModel:
    """The job's model on meta (`args`: the run's model args, run_model_args by default)."""
    load_model_modules(cfg.model.module)
    spec = get_train_spec(cfg.model.name)
    args = run_model_args(cfg) if args is None else args
    with torch.device("meta"):
        model = spec.model_cls(args)
    model = with_param_dtype(model, cfg.training.dtype)
    convert_model(model, cfg.model.converters, cfg.quantize.linear.float8)  # before any split
    return MetaModel(spec, model, args)


def with_param_dtype(model: torch.nn.Module, dtype: str) -> torch.nn.Module:
    """training.dtype: the parameters themselves in `dtype`, set on meta before the build (a
    parameter tied to two modules stays one); buffers (RoPE's tables) keep theirs."""
    if dtype == "float32":
        return model
    done: dict[int, torch.nn.Parameter] = {}
    for module in model.modules():
        for name, p in list(module.named_parameters(recurse=False)):
            if id(p) not in done:
                done[id(p)] = torch.nn.Parameter(p.detach().to(DTYPES[dtype]), p.requires_grad)
            setattr(module, name, done[id(p)])
    return model


def _model_keys(cfg: JobConfig) -> tuple:
    """What of a config the model's args are made from (training/model_args.run_model_args),
    but for the sequence length, and its float8 conversion ([quantize])."""
    return cfg.model, cfg.moe, cfg.quantize, cfg.checkpoint.initial_load_path


@dataclass(frozen=True)
class PlannedJob:
    """One job as the planners and the build path see it. `dims`: a ParallelDims (with its
    mesh) where the job is built or simulated; plain Degrees where only its shapes are needed
    (the layout search, before each layout gets a fake world of its own)."""

    cfg: JobConfig
    meta: MetaModel
    dims: Degrees
    target: str  # the device type the job is planned for: "cpu" or "cuda"

    @property
    def spec(self) -> TrainSpec:
        return self.meta.spec

    @property
    def model(self) -> nn.Module:
        return self.meta.model

    @property
    def args(self):
        return self.meta.args

    @cached_property
    def batch(self) -> BatchShape:
        """Global batch, accumulation steps and microbatches on the job's data-parallel ranks."""
        return batch_shape(self.cfg, self.dims.dp)

    @cached_property
    def microbatches(self) -> int:
        """Pipeline microbatches per local batch (1 without pipeline parallel)."""
        return pipeline_microbatches(self.cfg)

    @cached_property
    def layout(self) -> PipelineLayout | None:
        """The pipeline split of the model's blocks (None without pipeline parallel)."""
        return pipeline_layout(self.cfg.parallelism, self.args.n_layers, self.microbatches)

    def with_config(self, cfg: JobConfig, *, dims: Degrees | None = None) -> PlannedJob:
        """A candidate job: `cfg` (another AC mode, reshard policy, batch, sequence length or
        layout) for the same target, on `dims` (its own mesh; default: this job's). The model
        is kept, but for what its args are made of: another sequence length rebuilds it on
        meta with the args' RoPE length following (max_seq_len), another model (name, flavor,
        tokenizer, [moe], initial weights) builds that model's."""
        meta = self.meta
        if _model_keys(cfg) != _model_keys(self.cfg):
            meta = model_on_meta(cfg)
        elif self.args.max_seq_len != cfg.training.seq_len:  # RoPE tables follow seq_len
            meta = model_on_meta(
                cfg, dataclasses.replace(self.args, max_seq_len=cfg.training.seq_len)
            )
        return PlannedJob(cfg, meta, self.dims if dims is None else dims, self.target)

    def with_args(self, cfg: JobConfig, args) -> PlannedJob:
        """The job `cfg` with a model of other args (e.g. fewer blocks), built on meta."""
        return PlannedJob(cfg, model_on_meta(cfg, args), self.dims, self.target)

    def with_model(self, model: nn.Module, *, cfg: JobConfig | None = None) -> PlannedJob:
        """The job with `model` for its model (e.g. its own copy, which parallelizing may
        change) and `cfg` for its config (e.g. compile off; default: this job's)."""
        return PlannedJob(
            self.cfg if cfg is None else cfg,
            dataclasses.replace(self.meta, model=model),
            self.dims,
            self.target,
        )
