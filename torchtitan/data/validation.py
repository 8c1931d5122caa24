"""Held-out loss: the validation batches and when to measure them.

The batches come from their own dataloader, laid out like training batches (the same
global batch rows per data-parallel rank and gradient-accumulation micro-step), read at the
first measurement and kept, so each measurement sees the same batches and the training data
stream (and its checkpointed position) is never touched.
"""

import dataclasses
import math

from torchtitan.data.dataloader import build_dataloader


class Validator:
    def __init__(self, cfg, tokenizer, dp_rank: int, dp_degree: int, accum_steps: int):
        v = cfg.validation
        self.cfg = v
        self.data_cfg = dataclasses.replace(
            cfg.training, dataset=v.dataset, dataset_split=v.dataset_split,
            dataset_text_field=v.dataset_text_field, dataset_config_name=v.dataset_config_name,
        )
        self.tokenizer, self.dp_rank, self.dp_degree, self.accum_steps = tokenizer, dp_rank, dp_degree, accum_steps
        self._batches = None

    def due(self, step: int, last_step: int, start_step: int) -> bool:
        """Measure after this step? (step 0: before the first update, when not resuming.)"""
        if step == 0:
            return self.cfg.at_start and start_step == 0
        return step % self.cfg.freq == 0 or step == last_step

    def batches(self) -> list:
        """`steps` global batches, each a list of accum_steps (inputs, labels) micro-batches:
        read once, then kept (a few MB), so a hub dataset is not streamed again at every
        measurement."""
        if self._batches is None:
            loader = build_dataloader(self.data_cfg, self.tokenizer, self.dp_rank, self.dp_degree, self.accum_steps,
                                      section="validation")
            data = iter(loader)
            self._batches = [[next(data) for _ in range(self.accum_steps)] for _ in range(self.cfg.steps)]
        return self._batches

    def measure(self, eval_step) -> dict:
        """eval_step(batches) -> the global loss of one batch, as training computes it."""
        losses = [eval_step(b) for b in self.batches()]
        loss = sum(losses) / len(losses)
        return {"validation_loss": loss, "validation_perplexity": math.exp(min(loss, 700.0))}
