"""The training dataloader: torchdata's StatefulDataLoader over this rank's slots."""

from functools import partial

from torchdata.stateful_dataloader import StatefulDataLoader

from torchtitan.data.datasets import PackedSlotDataset
from torchtitan.data.sources import open_source
from torchtitan.data.tokenizer import Tokenizer


def build_dataloader(
    training, tokenizer: Tokenizer, dp_rank: int, dp_degree: int, accum_steps: int, section: str = "training"
) -> StatefulDataLoader:
    """Batches of (input_ids, labels), [local_batch_size, seq_len] each, one per micro-step.

    Main-process loading (num_workers=0): worker processes would each replay the same
    slots, and tokenising a few windows per step is cheap next to a training step.
    """
    rows_per_rank = training.local_batch_size * accum_steps
    dataset = PackedSlotDataset(
        make_source=partial(open_source, training.dataset, training.dataset_split, training.dataset_config_name),
        tokenizer=tokenizer,
        seq_len=training.seq_len,
        first_slot=dp_rank * rows_per_rank,
        n_slots=rows_per_rank,
        num_slots=rows_per_rank * dp_degree,
        text_field=training.dataset_text_field,
        section=section,  # which config keys a data error names
    )
    return StatefulDataLoader(dataset, batch_size=training.local_batch_size, num_workers=0)
