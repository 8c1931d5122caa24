"""Functions of torchtitan/ take at most five positional parameters (self / cls not counted);
the rest are keyword-only (after `*`), so every call names what it passes. A job being
planned travels as one value (training/planned_job.py's PlannedJob), not as a positional
group. Read with `ast`: nothing is imported.

EXEMPT holds the callables whose signature torch fixes; TODO_KEYWORD_ONLY the functions
still to change (their files are being edited elsewhere): the list only shrinks, and an entry
that no longer needs it fails the test until it is removed.
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

# To make keyword-only past the fifth parameter, with their call sites (to empty)
TODO_KEYWORD_ONLY = {
    # models/ and hf_convert.py
    "torchtitan/hf_convert.py::import_folder",
    "torchtitan/models/flavors.py::model_args",
    "torchtitan/models/llama3/parallelize.py::parallelize_llama",
    "torchtitan/models/qwen3/parallelize.py::parallelize_qwen3",
    "torchtitan/models/deepseek_v3/parallelize.py::parallelize_deepseekv3",
    "torchtitan/models/common/parallelize.py::parallelize_decoder",
    "torchtitan/models/common/init.py::init_parameters",
    "torchtitan/models/common/init.py::init_in_blocks",
    "torchtitan/models/common/init.py::expert_slices",
    "torchtitan/models/common/moe.py::TokenChoiceRouter.__init__",
    "torchtitan/models/common/moe.py::MoE.__init__",
    "torchtitan/models/common/rope.py::rope_cache",
    "torchtitan/models/hf/experts.py::prefer_fused",
    # data/
    "torchtitan/data/datasets.py::SlotStream.__init__",
    "torchtitan/data/datasets.py::SlotParts.__init__",
    "torchtitan/data/kinds.py::open_documents",
    "torchtitan/data/token_writer.py::tokenize_dataset",
    "torchtitan/data/token_writer.py::_publish",
    "torchtitan/data/dataloader.py::SlotLoader.__init__",
    "torchtitan/data/dataloader.py::build_dataloader",
    # checkpoint/files.py: called positionally from hf_convert.py (run_record) and
    # checks/outputs.py (start_point)
    "torchtitan/checkpoint/files.py::run_record",
    "torchtitan/checkpoint/files.py::start_point",
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
    new = sorted(v for k, v in found.items() if k not in EXEMPT and k not in TODO_KEYWORD_ONLY)
    assert new == [], (
        f"more than {MAX_POSITIONAL} positional parameters: make the rest keyword-only (`*`)"
        " and pass them by keyword (a job being planned: training/planned_job.PlannedJob):\n"
        + "\n".join(new)
    )


def test_the_exemptions_and_the_todo_list_name_only_functions_that_need_them():
    found = too_many_positional()
    stale = sorted(k for k in (*EXEMPT, *TODO_KEYWORD_ONLY) if k not in found)
    assert stale == [], "no longer over the limit (or gone): remove from the lists:\n" + "\n".join(
        stale
    )
    assert not set(EXEMPT) & TODO_KEYWORD_ONLY
