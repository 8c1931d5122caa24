"""The bad-input catalogue (bad_inputs.py): one line naming the key or path and the fix,
a non-zero exit before any process group, and the dump folder left exactly as it was."""

import json
import os
import subprocess

import pytest
import run_tests
from bad_inputs import CASES, expected, run_case


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_fails_fast_with_one_line(case, tmp_path):
    rc, lines, before, after = run_case(case, str(tmp_path / "dump"))
    assert rc == 2
    assert (
        len(lines) == 1
        and lines[0].startswith("error: ")
        and expected(case, str(tmp_path / "dump")) in lines[0]
    ), lines
    assert after == before


def test_issue_sequence_writes_nothing(tmp_path):
    """The report: a JSON file that is not a tokenizer, then a text field the local data lacks.
    Both used to end in a traceback, the second after writing metrics.jsonl, plan.json and
    TensorBoard files; now each is one line, exit 2, and the dump folder is never created."""
    inputs, dump = tmp_path / "inputs", tmp_path / "run"
    inputs.mkdir()
    (inputs / "tokenizer.json").write_text('{"a": 1}')
    (inputs / "data.jsonl").write_text(
        "".join(json.dumps({"text": f"doc {i}", "id": i}) + "\n" for i in range(8))
    )
    attempts = [
        (
            [f"--model.tokenizer_path={inputs / 'tokenizer.json'}"],
            f"error: --model.tokenizer_path='{inputs / 'tokenizer.json'}': not an HF tokenizer.json: JSON, but no"
            " tokenizer 'model' in it (its keys: a)",
        ),
        (
            [f"--training.dataset={inputs / 'data.jsonl'}", "--training.dataset_text_field=body"],
            f"error: --training.dataset_text_field='body': document 0 of '{inputs / 'data.jsonl'}' has no such column; its columns"
            " are: text, id",
        ),
    ]
    for args, expect in attempts:
        proc = subprocess.run(
            [run_tests.RUN_TRAIN, *args, f"--job.dump_folder={dump}"],
            env={**os.environ, "NGPU": "2"},
            capture_output=True,
            text=True,
        )
        lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
        assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(expect), lines
        assert "Traceback" not in proc.stderr
        assert not dump.exists()
