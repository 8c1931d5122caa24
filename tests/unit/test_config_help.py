"""--help text and field documentation. (The torch-free `python -m torchtitan.checks` in a process
of its own: tests/integration/test_checks_before_launch.py.)"""

import dataclasses
import re

import pytest

from torchtitan.config import build_config
from torchtitan.config import job_config as jc
from torchtitan.config.manager import field_docs, field_types, sections

# Every section of a job: JobConfig's fields, in their order.
SECTION_NAMES = list(sections())  # nested ones ("training.dataloader") included


# --------------------------------------------------------------------------- --help


def _all_fields():
    for name, cls in sections().items():
        for f in dataclasses.fields(cls):
            if f.name in field_types(cls):  # a nested section is a section, not a key
                yield name, cls, f


def test_every_field_has_a_non_empty_doc():
    missing = [
        f"{name}.{f.name}"
        for name, cls, f in _all_fields()
        if not field_docs(cls).get(f.name, "").strip()
    ]
    assert missing == []
    # field_docs joins multi-line docstrings into one line
    assert field_docs(jc.Model)["tokenizer_path"] == (
        "HF tokenizer.json file (or a folder holding one). Empty = the small BPE tokenizer"
        " bundled in torchtitan/assets (built by scripts/build_tokenizer.py)."
    )
    assert field_docs(jc.Compile)["enable"] == (
        "Compile each transformer block with torch.compile (one graph per block kind, static shapes;"
        " docs/compile.md). Refused with a zero-bubble pipeline schedule, which torch 2.13 cannot run on"
        " compiled stages."
    )


@dataclasses.dataclass
class _PartlyDocumented:
    a: int = 1
    """Doc of a."""

    b: int = 2
    c: str = "x"
    """Doc of c,
    on two lines."""


def test_field_docs_skip_fields_without_a_docstring():
    assert field_docs(_PartlyDocumented) == {"a": "Doc of a.", "c": "Doc of c, on two lines."}


def test_help_prints_every_key_with_type_default_and_doc(capsys):
    with pytest.raises(SystemExit) as info:
        build_config(["--training.steps=3", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr()
    assert out.err == ""
    lines = out.out.splitlines()
    assert lines[0].startswith("usage: run_train.sh [--section.key=value ...]")
    for name, cls, f in _all_fields():
        head = [i for i, line in enumerate(lines) if line.startswith(f"  --{name}.{f.name} (")]
        assert len(head) == 1, f"{name}.{f.name} missing from --help"
        doc = field_docs(cls)[f.name]
        assert lines[head[0] + 1] == f"      {doc}"
    # one header per section, in JobConfig's order, and no other
    assert [line[1:-1] for line in lines if re.fullmatch(r"\[[\w.]+\]", line)] == SECTION_NAMES
    assert "  --training.steps (int, default 10)" in lines
    assert "  --training.device (auto|cpu|cuda, default 'auto')" in lines
    assert "  --optimizer.lr (float, default 0.0008)" in lines
    assert "  --job.print_config (bool, default False)" in lines


def test_help_short_flag(capsys):
    with pytest.raises(SystemExit) as info:
        build_config(["-h"])
    assert info.value.code == 0
    assert "  --hardware.peak_tflops (float|auto, default 'auto')" in capsys.readouterr().out
