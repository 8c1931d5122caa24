"""docs/config.md is generated from the config's docstrings (scripts/render_config_docs.py) and
must match them; every key has a docstring; docstrings state what a key does, not measured figures."""

import importlib.util
import os
import re

from torchtitan.config import manager

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _renderer():
    spec = importlib.util.spec_from_file_location(
        "render_config_docs", os.path.join(ROOT, "scripts", "render_config_docs.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_config_md_is_up_to_date():
    renderer = _renderer()
    with open(renderer.OUT) as f:
        assert f.read() == renderer.render(), (
            "docs/config.md is stale: run python scripts/render_config_docs.py"
        )


def test_every_key_is_in_the_reference_with_its_docstring():
    text = _renderer().render()
    for name, cls in manager.sections().items():
        assert f"## {name}\n" in text
        docs = manager.field_docs(cls)
        for key in manager.field_types(cls):
            assert docs.get(key), f"{name}.{key} has no docstring"
            assert f"- **`{key}`** (" in text and docs[key] in text


def test_docstrings_hold_no_measured_figures():
    # a figure measured on one machine ("238 s of 300", "~10%") belongs to the docs, not the key
    measured = re.compile(r"\b\d+(\.\d+)? ?(s|ms|MiB|GiB|%)\b( of \d+)?|this project's|measured on")
    for name, cls in manager.sections().items():
        for key, doc in manager.field_docs(cls).items():
            assert not measured.search(doc), (f"{name}.{key}", doc)
