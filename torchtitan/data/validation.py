"""Held-out loss: the validation batches and when to measure them.

The batches come from their own dataloader, laid out like training batches (the same
global batch rows per data-parallel rank and gradient-accumulation micro-step), read at the
first measurement and kept, so each measurement sees the same batches and the training data
stream (and its checkpointed position) is never touched. Its rows per rank and tokens per row
are validation.local_batch_size and seq_len (auto: training's); its loader's workers are
[validation.dataloader]'s.
"""

import dataclasses
import math
import os

from torchtitan.data.dataloader import build_dataloader, loader_options, resolve_workers
from torchtitan.data.sources import per_source_split


def validation_shape(cfg) -> tuple[int, int]:
    """(rows per rank per micro-step, tokens per row) of a validation batch: validation's
    local_batch_size and seq_len, auto = training's."""
    v, t = cfg.validation, cfg.training
    rows = t.local_batch_size if v.local_batch_size == "auto" else int(v.local_batch_size)
    return rows, t.seq_len if v.seq_len == "auto" else int(v.seq_len)


def per_source_sets(entries: list[str]) -> list[tuple[str, str]]:
    """[validation] per_source entries -> (name, dataset): 'name=dataset', or the dataset named
    after its file (as mixture sources are)."""
    out = []
    for entry in entries:
        name, sep, dataset = entry.partition("=")
        if not sep or os.path.exists(os.path.expanduser(entry)):
            dataset = entry
            name = os.path.basename(os.path.normpath(entry)).split(".")[0] or entry
        out.append((name, dataset))
    return out


class Validator:
    def __init__(
        self,
        cfg,
        tokenizer,
        dp_rank: int,
        dp_degree: int,
        accum_steps: int,
        *,
        device_type: str = "cpu",
    ):
        v = cfg.validation
        self.cfg = v
        self.workers = resolve_workers(v.dataloader.num_workers, device_type)
        self.options = loader_options(v.dataloader, device_type)
        rows, seq_len = validation_shape(cfg)
        self.data_cfg = dataclasses.replace(
            cfg.training,
            local_batch_size=rows,
            seq_len=seq_len,
            dataset=v.dataset,
            dataset_split=v.dataset_split,
            dataset_text_field=v.dataset_text_field,
            dataset_config_name=v.dataset_config_name,
            dataset_mix=[],
        )
        self.tokenizer, self.dp_rank, self.dp_degree, self.accum_steps = (
            tokenizer,
            dp_rank,
            dp_degree,
            accum_steps,
        )
        self.sets = {
            "": self.data_cfg
        }  # "" = [validation] dataset; then each per-source set by name
        for name, dataset in per_source_sets(v.per_source):
            self.sets[name] = dataclasses.replace(
                self.data_cfg,
                dataset=dataset,
                dataset_split=per_source_split(dataset, v.dataset_split),
            )
        self._batches: dict[str, list] = {}

    def due(self, step: int, last_step: int, start_step: int) -> bool:
        """Measure after this step? (step 0: before the first update, when not resuming.)"""
        if step == 0:
            return self.cfg.at_start and start_step == 0
        return step % self.cfg.freq == 0 or step == last_step

    def batches(self, name: str = "") -> list:
        """`steps` global batches of a set, each a list of accum_steps (inputs, labels)
        micro-batches: read once, then kept (a few MB), so a hub dataset is not streamed again
        at every measurement."""
        if name not in self._batches:
            loader = build_dataloader(
                self.sets[name],
                self.tokenizer,
                self.dp_rank,
                self.dp_degree,
                self.accum_steps,
                section="validation",
                workers=self.workers,
                options=self.options,
            )
            data = iter(loader)
            self._batches[name] = [
                [next(data) for _ in range(self.accum_steps)] for _ in range(self.cfg.steps)
            ]
        return self._batches[name]

    def measure(self, eval_step) -> dict:
        """eval_step(batches) -> the global loss of one batch, as training computes it.
        validation_loss / _perplexity, and /<name> for each per-source set."""
        out = {}
        for name in self.sets:
            losses = [eval_step(b) for b in self.batches(name)]
            loss = sum(losses) / len(losses)
            suffix = f"/{name}" if name else ""
            out[f"validation_loss{suffix}"] = loss
            out[f"validation_perplexity{suffix}"] = math.exp(min(loss, 700.0))
        return out
