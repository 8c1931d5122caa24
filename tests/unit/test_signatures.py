"""Functions of torchtitan/ take at most five positional parameters (self / cls not counted);
the rest are keyword-only (after `*`), so every call names what it passes. A job being
planned travels as one value (training/planned_job.py's PlannedJob), not as a positional
group. Read with `ast`: nothing is imported.

EXEMPT holds the callables whose signature torch fixes; an entry that no longer needs it
fails the test until it is removed.
"""

from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAX_POSITIONAL = 5

# path::qualified name -> why torch fixes the signature
EXEMPT = {
    # aten._grouped_mm's fake kernel: torch's FakeTensor dispatch calls it with the op's arguments
    "torchtitan/planning/simulate/patches.py::_grouped_mm_fake": "fake kernel of an aten op",
    # a torch.library custom op: its schema (positional) is the function's signature
    "torchtitan/distributed/simple_fsdp.py::_gather_op": "torch.library custom op",
    # the custom op's register_fake kernel: torch calls it with the op's arguments, positionally
    "torchtitan/distributed/simple_fsdp.py::_": "register_fake of the custom op",
}


def _positional(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    names = [a.arg for a in node.args.posonlyargs + node.args.args]
    return len([n for n in names if n not in ("self", "cls")])


def _functions(tree: ast.AST, prefix: str = ""):
    """(qualified name, node) of every function, methods and nested functions included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield f"{prefix}{node.name}", node
            yield from _functions(node, f"{prefix}{node.name}.")


def too_many_positional() -> dict[str, str]:
    """path::qualified name -> 'path:line (n positional)' of every function over the limit."""
    out = {}
    for folder, dirs, files in os.walk(os.path.join(ROOT, "torchtitan")):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for f in sorted(f for f in files if f.endswith(".py")):
            rel = os.path.relpath(os.path.join(folder, f), ROOT).replace(os.sep, "/")
            with open(os.path.join(ROOT, rel)) as src:
                tree = ast.parse(src.read(), rel)
            for name, node in _functions(tree):
                n = _positional(node)
                if n > MAX_POSITIONAL:
                    out[f"{rel}::{name}"] = f"{rel}:{node.lineno} ({n} positional)"
    return out


def test_functions_take_at_most_five_positional_parameters():
    found = too_many_positional()
    new = sorted(v for k, v in found.items() if k not in EXEMPT)
    assert new == [], (
        f"more than {MAX_POSITIONAL} positional parameters: make the rest keyword-only (`*`)"
        " and pass them by keyword (a job being planned: training/planned_job.PlannedJob):\n"
        + "\n".join(new)
    )


def test_the_exemptions_name_only_functions_that_need_them():
    found = too_many_positional()
    stale = sorted(k for k in EXEMPT if k not in found)
    assert stale == [], "no longer over the limit (or gone): remove from EXEMPT:\n" + "\n".join(
        stale
    )
