"""The bad-input catalogue (bad_inputs.py): one line naming the key or path and the fix,
a non-zero exit before any process group, and the dump folder left exactly as it was."""

import pytest

from bad_inputs import CASES, run_case


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_fails_fast_with_one_line(case, tmp_path):
    rc, lines, before, after = run_case(case, str(tmp_path / "dump"))
    assert rc == 2
    assert len(lines) == 1 and lines[0].startswith("error: ") and case.expect in lines[0], lines
    assert after == before
