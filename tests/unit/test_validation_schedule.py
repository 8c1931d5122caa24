"""When validation runs, and the embedded held-out split it reads by default."""

from types import SimpleNamespace

from torchtitan.data.corpus import pydoc_documents
from torchtitan.data.validation import Validator


def _validator(freq, at_start):
    v = Validator.__new__(Validator)
    v.cfg = SimpleNamespace(freq=freq, at_start=at_start)
    return v


def test_due_at_start_every_freq_steps_and_after_the_last_step():
    v = _validator(freq=4, at_start=True)
    assert [s for s in range(0, 11) if v.due(s, last_step=10, start_step=0)] == [0, 4, 8, 10]
    # A resumed run does not repeat the baseline; a run without at_start has none.
    assert not v.due(0, last_step=10, start_step=4)
    assert [s for s in range(0, 11) if _validator(3, False).due(s, 10, 0)] == [3, 6, 9, 10]


def test_pydoc_validation_split_is_held_out_prose():
    train, val = pydoc_documents("train"), pydoc_documents("validation")
    assert len(val) > 100 and sum(map(len, val)) > 100_000
    assert not set(train) & set(val)
    assert pydoc_documents("validation") == val  # the same documents every time
