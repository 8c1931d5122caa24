"""Loader workers (processes) own whole parts of micro-steps: the batches and the saved data
position are those of the loader without workers, and a position saved with one worker count
loads into another and into another layout."""

import json

import pytest

from torchtitan.config import build_config
from torchtitan.data.dataloader import build_dataloader
from torchtitan.data.tokenizer import Tokenizer

# torch warns of more workers than this 2-core machine has cores: intended here
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    path = tmp_path_factory.mktemp("workers") / "d.jsonl"
    path.write_text(
        "".join(json.dumps({"text": f"document {i} " * (2 + i % 23)}) + "\n" for i in range(200))
    )
    return str(path)


def _loader(source, lbs, dp_rank, dp, accum, workers):
    cfg = build_config(
        [
            f"--training.dataset={source}",
            f"--training.local_batch_size={lbs}",
            "--training.seq_len=16",
        ]
    )[0].training
    return build_dataloader(cfg, Tokenizer(), dp_rank, dp, accum, workers=workers)


def _take(loader, n):
    it = iter(loader)
    return [next(it) for _ in range(n)]


def _same(a, b):
    assert len(a) == len(b)
    for (x, y), (u, v) in zip(a, b):
        assert x.equal(u) and y.equal(v)


@pytest.mark.parametrize(
    "lbs, accum, workers, used", [(2, 1, 2, (2, 2)), (1, 3, 3, (3, 1)), (2, 2, 4, (4, 2))]
)
def test_workers_give_the_batches_and_position_of_no_workers(source, lbs, accum, workers, used):
    plain, many = _loader(source, lbs, 0, 2, accum, 0), _loader(source, lbs, 0, 2, accum, workers)
    assert (many.workers, many.parts_per_step) == used
    _same(_take(plain, 5 * accum), _take(many, 5 * accum))
    assert plain.state_dict() == many.state_dict()


def test_a_position_saved_with_workers_loads_into_other_counts_and_layouts(source):
    straight = _loader(source, 2, 0, 1, 2, 0)
    expected = _take(straight, 10)[6:]  # steps 4-5 of the 1-rank, 2-accumulation layout
    saving = _loader(source, 2, 0, 1, 2, 2)
    _take(saving, 6)
    state = saving.state_dict()
    again = _loader(source, 2, 0, 1, 2, 0)
    again.load_state_dict(state)
    _same(_take(again, 4), expected)
    for rank in range(2):  # 2 ranks without accumulation, 1 worker each
        part = _loader(source, 2, rank, 2, 1, 1)
        part.load_state_dict(state)
        _same(_take(part, 2), [expected[rank], expected[2 + rank]])
