"""The run_tests.py cases under pytest: each case's losses vs the 1-rank reference."""

import os

import pytest
import run_tests


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    dump = str(tmp_path_factory.mktemp("reference"))
    rc, _, log = run_tests.run(1, [], dump)
    assert rc == 0, log[-3000:]
    return run_tests.read_losses(dump)


FAST = [c for c in run_tests.CASES if not c.slow]
SLOW = [c for c in run_tests.CASES if c.slow]


def _check(case, reference, tmp_path):
    dump = str(tmp_path / case.name)
    rc, _, log = run_tests.run(case.ngpu, case.overrides, dump)
    assert rc == 0, log[-3000:]
    losses = run_tests.read_losses(dump)
    assert len(losses) == run_tests.STEPS
    assert run_tests.max_rel_diff(losses, reference) <= 1e-4, (losses, reference)


@pytest.mark.parametrize("case", FAST, ids=[c.name for c in FAST])
def test_case_matches_one_rank(case, reference, tmp_path):
    _check(case, reference, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("case", SLOW, ids=[c.name for c in SLOW])
def test_slow_case_matches_one_rank(case, reference, tmp_path):
    _check(case, reference, tmp_path)


def test_reference_loss_decreases(reference):
    assert reference[-1] < reference[0] - 0.1, reference
