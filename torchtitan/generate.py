"""Text generation from a trained checkpoint: the entry point behind scripts/generate.py.

The job's config (its TOML + overrides, as the trainer reads them) names the model, flavor,
tokenizer and context length; the weights come from a DCP step folder this framework saved
(full or model-only), a checkpoint folder holding step-N folders (the newest complete one),
or a Hugging Face folder. On one process the model is plain; on NGPU ranks it is split by the
model's own TP plan over a 1-D mesh of every rank (DCP then loads into the DTensors).

Every problem with the input (flags, config, checkpoint path, a checkpoint of another model
or shape) is one `GenerateError` / `ConfigError` line naming the flag and the fix, raised by
`prepare` before any process group starts. No KV cache: each new token runs the whole
sequence again, which is what a sanity check of a checkpoint needs (and exact).
"""

from __future__ import annotations

import argparse
import logging
import os
import time
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

from torchtitan.checkpoint.files import (
    COMPLETE_MARKER,
    DCP_METADATA,
    CheckpointError,
    newest_first,
    read_marker,
    scan,
)
from torchtitan.checkpoint.states import ModelState
from torchtitan.checks.data import check_tokenizer
from torchtitan.checks.layout import check_model
from torchtitan.config import ConfigError, JobConfig, build_config
from torchtitan.data.tokenizer import Tokenizer, load_model_tokenizer
from torchtitan.distributed.process_groups import (
    init_distributed,
    pick_device,
    shutdown_distributed,
)
from torchtitan.models.hf.folder import HFFolderError, check_folder, is_hf_folder
from torchtitan.models.hf.weights import load_hf_weights
from torchtitan.models.registry import model_entry
from torchtitan.training.model_args import run_model_args
from torchtitan.training.planned_job import MetaModel, model_on_meta

logger = logging.getLogger(__name__)


class GenerateError(ValueError):
    """Bad input to generation; the message is one line naming the flag and the fix."""


@dataclass(frozen=True)
class Options:
    """What generation is asked for, beyond the job's config."""

    checkpoint: str  # "" = the job's own checkpoint folder (<dump_folder>/<checkpoint.folder>)
    prompt: str
    max_new_tokens: int = 32
    temperature: float = 0.0  # 0: greedy (argmax)
    top_k: int | None = None  # sample among the k likeliest tokens only
    seed: int = 0  # of the sampling generator (the same on every rank)
    out: str = ""  # a JSON report written by the CLI (rank 0)
    check_only: bool = False  # run the checks in this process and stop (run_generate.sh)


@dataclass(frozen=True)
class Source:
    """Where the weights come from: "dcp" (a step folder) or "hf" (a Hugging Face folder)."""

    kind: str
    path: str


@dataclass
class Prepared:
    """A checked generation job: config, options, model on meta, tokenizer, prompt ids, weights."""

    cfg: JobConfig
    options: Options
    meta: MetaModel
    tokenizer: Tokenizer
    prompt_ids: list[int]
    source: Source
    world_size: int = 1


@dataclass
class Result:
    """What one generation produced (the same on every rank)."""

    prompt: str
    completion: str  # the decoded new tokens
    prompt_ids: list[int]
    new_ids: list[int]
    seconds: float  # the generation loop (weights already loaded)
    source: Source
    world_size: int
    # greedy only: the smallest gap between the two largest logits over the new tokens,
    # i.e. how far the choice was from a tie another layout's rounding could flip
    min_margin: float | None = None

    @property
    def tokens_per_second(self) -> float:
        return len(self.new_ids) / self.seconds if self.seconds > 0 else float("inf")

    def record(self) -> dict:
        return {
            "prompt": self.prompt,
            "completion": self.completion,
            "prompt_ids": self.prompt_ids,
            "new_ids": self.new_ids,
            "seconds": self.seconds,
            "tokens_per_second": self.tokens_per_second,
            "checkpoint": self.source.path,
            "checkpoint_kind": self.source.kind,
            "world_size": self.world_size,
            "min_margin": self.min_margin,
        }


# ------------------------------------------------------------------ flags


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's usage + message, as one line of ours
        raise GenerateError(f"{message}; see scripts/generate.py --help")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="scripts/generate.py",
        allow_abbrev=False,  # a mistyped flag must not silently become another
        description="Generate text from a checkpoint. Any other --section.key=value is a config"
        " override, as for run_train.sh (--job.config_file names the TOML).",
    )
    p.add_argument(
        "--checkpoint", default="", help="DCP step folder, checkpoint folder or HF folder"
    )
    p.add_argument("--prompt", default="", help="the text to continue")
    p.add_argument("--max_new_tokens", type=int, default=32, help="tokens to generate")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top_k", type=int, default=None, help="sample among the k likeliest")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling generator")
    p.add_argument("--out", default="", help="also write a JSON report to this file")
    p.add_argument("--check_only", action="store_true", help="check the input, generate nothing")
    return p


def parse(argv: list[str]) -> tuple[Options, JobConfig]:
    """argv -> (options, job config); ConfigError / GenerateError on bad input."""
    ns, rest = _parser().parse_known_args(argv)
    cfg, _ = build_config(rest)
    options = Options(**vars(ns))
    if options.max_new_tokens < 1:
        raise GenerateError(f"--max_new_tokens={options.max_new_tokens}: give at least 1")
    if options.temperature < 0:
        raise GenerateError(f"--temperature={options.temperature}: give 0 (greedy) or more")
    if options.top_k is not None and options.top_k < 1:
        raise GenerateError(f"--top_k={options.top_k}: give at least 1, or leave it out")
    return options, cfg


# ------------------------------------------------------------------ checks (no process group)

_WHAT = (
    "give a step folder (<dump_folder>/checkpoint/step-N), the checkpoint folder holding"
    " step-N folders, or a Hugging Face folder (config.json + *.safetensors)"
)


def find_source(path: str) -> Source:
    """The weights at `path`: an HF folder, a DCP step folder, or the newest complete step
    folder of a checkpoint folder (weights-only exports included: they are the newest weights)."""
    if not os.path.exists(path):
        raise GenerateError(f"--checkpoint: '{path}' does not exist; {_WHAT}")
    if is_hf_folder(path):
        return Source("hf", path)
    if os.path.isfile(os.path.join(path, DCP_METADATA)):
        return Source("dcp", path)
    try:
        found = scan(path)
    except CheckpointError as e:
        raise GenerateError(f"--checkpoint: {e}") from None
    done = newest_first([c for c in found if c.complete])
    if done:
        return Source("dcp", done[0].path)
    which = f" (only incomplete saves: {found[0].path}, ...)" if found else ""
    raise GenerateError(f"--checkpoint: '{path}' holds no checkpoint{which}; {_WHAT}")


def expected_shapes(meta: MetaModel) -> dict[str, tuple[int, ...]]:
    """The state a checkpoint of this model holds ("model.<name>" -> shape), as it saves it."""
    state = ModelState([meta.model]).state_dict()
    return {f"model.{k}": tuple(v.shape) for k, v in state.items()}


def check_dcp(path: str, cfg: JobConfig, meta: MetaModel) -> None:
    """The step folder's marker names this model, and every tensor has this model's shape."""
    m = cfg.model
    try:
        marker = read_marker(path)
    except CheckpointError as e:
        raise GenerateError(f"--checkpoint: {e}") from None
    if marker is None:
        raise GenerateError(
            f"--checkpoint: '{path}' has no {COMPLETE_MARKER} marker (its save never finished);"
            " give a complete step folder"
        )
    saved = marker.get("model")
    if saved is not None and saved != f"{m.name}/{m.flavor}":
        name, _, flavor = saved.partition("/")
        raise GenerateError(
            f"--checkpoint: '{path}' holds {saved}, the config names {m.name}/{m.flavor}: set"
            f" --model.name={name} --model.flavor={flavor} (or the TOML it was trained with)"
        )
    stored = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    stored = {k: tuple(v.size) for k, v in stored.items() if k.startswith("model.")}
    want = expected_shapes(meta)
    fix = "pick the --model.flavor, --model.tokenizer_path and [moe] keys it was trained with"
    for key, shape in want.items():
        if key not in stored:
            raise GenerateError(
                f"--checkpoint: '{path}' has no tensor '{key}' of {m.name} {m.flavor}; {fix}"
            )
        if stored[key] != shape:
            raise GenerateError(
                f"--checkpoint: tensor '{key}' in '{path}' has shape {list(stored[key])},"
                f" {m.name} {m.flavor} needs {list(shape)}; {fix}"
            )
    extra = sorted(set(stored) - set(want))
    if extra:
        raise GenerateError(
            f"--checkpoint: '{path}' holds {len(extra)} tensor(s) {m.name} {m.flavor} has no"
            f" place for, e.g. '{extra[0]}'; {fix}"
        )


def check_layout(cfg: JobConfig, args, world_size: int) -> None:
    """Generation splits the model over every rank with TP and nothing else (TP = the number
    of ranks when the config leaves tensor_parallel_degree at 1, as upstream's script does)."""
    if cfg.parallelism.tensor_parallel_degree == 1 and world_size > 1:
        # upstream's generation splits over all its ranks by TP: a TOML without the key does too
        cfg.parallelism.tensor_parallel_degree = world_size
    tp = cfg.parallelism.tensor_parallel_degree
    if tp != world_size:
        raise GenerateError(
            f"--parallelism.tensor_parallel_degree={tp} with {world_size} rank(s): generation"
            f" splits the model over every rank with TP only; set NGPU={tp} or"
            f" --parallelism.tensor_parallel_degree={world_size}"
        )
    att = args.attention
    for key, heads in (("n_heads", att.n_heads), ("n_kv_heads", att.n_kv_heads)) if att else ():
        if heads % tp:
            raise GenerateError(
                f"--parallelism.tensor_parallel_degree={tp} does not divide {cfg.model.name}"
                f" {cfg.model.flavor} {key}={heads}; pick a divisor of {heads}"
            )
    if (
        tp > 1
        and getattr(model_entry(cfg.model.name).module("parallelize"), "apply_tp", None) is None
    ):
        raise GenerateError(
            f"--parallelism.tensor_parallel_degree={tp}: {cfg.model.name} has no apply_tp in its"
            " parallelize module; generate on 1 rank (NGPU=1, tensor_parallel_degree=1)"
        )


def padded_length(length: int, tp: int) -> int:
    """Sequence parallel splits the tokens evenly over TP: inputs are padded up to a multiple."""
    return -(-length // tp) * tp


def prepare(options: Options, cfg: JobConfig, world_size: int = 1) -> Prepared:
    """Every check, in this process, before any process group: the model, the layout, the
    tokenizer, the prompt's length, the checkpoint. Raises ConfigError or GenerateError."""
    flavor_args = check_model(cfg)
    path = options.checkpoint or os.path.join(cfg.job.dump_folder, cfg.checkpoint.folder)
    source = find_source(path)
    # the model's rules (e.g. DeepSeek-V3's YaRN) follow the weights, as for a run started from them
    cfg.checkpoint.initial_load_path = source.path
    check_tokenizer(cfg, flavor_args)
    tokenizer = load_model_tokenizer(cfg.model)
    args = run_model_args(cfg)
    check_layout(cfg, args, world_size)
    ids = tokenizer.encode(options.prompt, bos=True, eos=False)
    if not ids:
        raise GenerateError("--prompt is empty and the tokenizer has no BOS token: give a prompt")
    context = cfg.training.seq_len
    longest = padded_length(len(ids) + options.max_new_tokens - 1, world_size)
    if longest > context:
        room = context // world_size * world_size - len(ids) + 1
        raise GenerateError(
            f"--max_new_tokens={options.max_new_tokens}: the prompt's {len(ids)} tokens and the new"
            f" ones exceed the model's context of {context} tokens (--training.seq_len); ask for at"
            f" most {max(room, 0)} new tokens, shorten the prompt, or raise --training.seq_len"
        )
    meta = model_on_meta(cfg, args)
    if source.kind == "hf":
        try:
            check_folder(source.path, cfg.model.name, cfg.model.flavor, args, key="--checkpoint")
        except HFFolderError as e:
            raise GenerateError(str(e)) from None
    else:
        check_dcp(source.path, cfg, meta)
    return Prepared(cfg, options, meta, tokenizer, ids, source, world_size)


# ------------------------------------------------------------------ the model


def build_model(job: Prepared, device: torch.device) -> nn.Module:
    """The model on `device` with the checkpoint's weights, split by its TP plan over every
    rank when there are several (the process group is up)."""
    model = job.meta.model
    cfg = job.cfg
    if job.world_size > 1:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device.type, (job.world_size,), mesh_dim_names=("tp",))
        apply_tp = model_entry(cfg.model.name).module("parallelize").apply_tp
        apply_tp(model, mesh, False)  # full logits on every rank: no loss-parallel sharding
    model.to_empty(device=device)
    model.init_weights(cfg.training.seed, device)  # buffers (RoPE); every weight is read below
    if job.source.kind == "hf":
        load_hf_weights([model], job.source.path, cfg.model.name, job.meta.args, key="--checkpoint")
    else:
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(
                {"model": ModelState([model])},
                checkpoint_id=job.source.path,
                no_dist=job.world_size == 1,
            )
    return model.eval()


# ------------------------------------------------------------------ sampling


def pick_token(
    logits: torch.Tensor, options: Options, generator: torch.Generator | None = None
) -> int:
    """The next token from one position's logits [vocab]: argmax at temperature 0, else a
    draw from softmax(logits / temperature) over the top_k likeliest (all when top_k is None)."""
    if options.temperature == 0:
        return int(torch.argmax(logits))
    scaled = logits.float() / options.temperature
    if options.top_k is not None and options.top_k < scaled.numel():
        kth = torch.topk(scaled, options.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


@torch.no_grad()
def generate_ids(
    model: nn.Module, job: Prepared, device: torch.device
) -> tuple[list[int], float | None]:
    """`max_new_tokens` token ids after the prompt, and (greedy) the smallest top-2 logit gap.
    Under TP every rank computes the same logits; rank 0's choice is broadcast all the same,
    so a sampled token can never differ between ranks."""
    options, tp = job.options, job.world_size
    generator = torch.Generator(device=device).manual_seed(options.seed)
    ids, new, margin = list(job.prompt_ids), [], None
    pad = job.tokenizer.eos_id  # after the last real token: the causal mask never lets it be seen
    for _ in range(options.max_new_tokens):
        x = ids + [pad] * (padded_length(len(ids), tp) - len(ids))
        logits = model(torch.tensor([x], device=device))[0, len(ids) - 1]
        token = torch.tensor([pick_token(logits, options, generator)], device=device)
        if tp > 1:
            dist.broadcast(token, src=0)
        if options.temperature == 0:
            top = torch.topk(logits.float(), 2).values
            gap = float(top[0] - top[1])
            margin = gap if margin is None else min(margin, gap)
        ids.append(int(token))
        new.append(int(token))
    return new, margin


def generate(job: Prepared) -> Result:
    """Build, load and generate on this rank (the process group is up when world_size > 1)."""
    device = pick_device(job.cfg.training.device)
    model = build_model(job, device)
    start = time.perf_counter()
    new, margin = generate_ids(model, job, device)
    seconds = time.perf_counter() - start
    o = job.options
    return Result(
        o.prompt,
        job.tokenizer.decode(new),
        job.prompt_ids,
        new,
        seconds,
        source=job.source,
        world_size=job.world_size,
        min_margin=margin,
    )


def run(options: Options, cfg: JobConfig) -> Result | None:
    """The whole generation on this rank: check (before any process group), join the ranks
    when there are several, generate; None for --check_only."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    job = prepare(options, cfg, world)
    if options.check_only:
        return None
    if world == 1:
        return generate(job)
    init_distributed(pick_device(cfg.training.device), cfg.comm.timeout_seconds)
    result = generate(job)
    shutdown_distributed()  # not after a failure: a barrier with a failed rank would hang
    return result


__all__ = [
    "ConfigError",
    "GenerateError",
    "Options",
    "Result",
    "parse",
    "pick_token",
    "prepare",
    "run",
]
