#!/usr/bin/env python3
"""Counts of the house issue's smells in a tree, by ast (nothing is imported):

    python scripts/house_counts.py [--tree PATH] [--list]

- model-args probes outside models/: getattr / hasattr on a value named `...args` (the model
  args: `args`, `run_args`, `self.meta.args`, ...) in torchtitan/ but not torchtitan/models/;
  Dynamo's callback arguments (distributed/compile.py, `CallbackArgs`) are not model args.
- GPU peak tables: modules of torchtitan/ that state the H100's dense bf16 peak (989.x TFLOPS).
- step tails: functions of torchtitan/ that clip gradients (call clip_grad_norm_) and step an
  optimizer.
- functions of 8+ parameters (self / cls not counted), in torchtitan/ and in the whole tree.
- broad excepts: `except:`, `except Exception`, `except BaseException` in torchtitan/.
- print calls in torchtitan/.
"""

from __future__ import annotations

import argparse
import ast
import os
import re

ARGS_NAME = re.compile(r"(^|\.)(\w+_)?args$")
NOT_MODEL_ARGS = {os.path.join("torchtitan", "distributed", "compile.py")}


def py_files(root: str, under: str = "") -> list[str]:
    out = []
    for folder, dirs, files in os.walk(os.path.join(root, under)):
        dirs[:] = [d for d in dirs if d not in (".venv", ".git", "outputs", "__pycache__")]
        out += [os.path.join(folder, f) for f in files if f.endswith(".py")]
    return sorted(out)


def _calls(tree: ast.AST, name: str):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if (isinstance(f, ast.Name) and f.id == name) or (
                isinstance(f, ast.Attribute) and f.attr == name
            ):
                yield node


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    names = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]
    return len([n for n in names if n not in ("self", "cls")])


def counts(root: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {
        k: []
        for k in (
            "probes",
            "peak_tables",
            "step_tails",
            "params8_pkg",
            "params8_all",
            "broad_excepts",
            "prints",
        )
    }
    for path in py_files(root):
        rel = os.path.relpath(path, root)
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        in_pkg = rel.startswith("torchtitan" + os.sep)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _params(node) >= 8:
                found["params8_all"].append(f"{rel}:{node.lineno} {node.name}")
                if in_pkg:
                    found["params8_pkg"].append(f"{rel}:{node.lineno} {node.name}")
        if not in_pkg:
            continue
        if (
            not rel.startswith(os.path.join("torchtitan", "models") + os.sep)
            and rel not in NOT_MODEL_ARGS
        ):
            for name in ("getattr", "hasattr"):
                for call in _calls(tree, name):
                    if call.args and ARGS_NAME.search(ast.unparse(call.args[0])):
                        found["probes"].append(f"{rel}:{call.lineno} {ast.unparse(call)[:70]}")
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, float)
                and 989.0 <= node.value < 990.0
            ):
                found["peak_tables"].append(f"{rel}:{node.lineno}")
                break
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                called = {
                    c.func.attr if isinstance(c.func, ast.Attribute) else getattr(c.func, "id", "")
                    for c in ast.walk(node)
                    if isinstance(c, ast.Call)
                }
                if "clip_grad_norm_" in called and "step" in called:
                    found["step_tails"].append(f"{rel}:{node.lineno} {node.name}")
            if isinstance(node, ast.ExceptHandler):
                t = node.type
                names = (
                    []
                    if t is None
                    else [ast.unparse(e) for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
                )
                if t is None or any(n in ("Exception", "BaseException") for n in names):
                    found["broad_excepts"].append(
                        f"{rel}:{node.lineno} except {', '.join(names) or ''}"
                    )
        found["prints"] += [
            f"{rel}:{c.lineno}" for c in _calls(tree, "print") if isinstance(c.func, ast.Name)
        ]
    return found


LABELS = {
    "probes": "model-args probes outside models/",
    "peak_tables": "GPU peak tables (modules stating the H100 bf16 peak)",
    "step_tails": "step tails (functions that clip and step)",
    "params8_pkg": "functions of 8+ parameters, torchtitan/",
    "params8_all": "functions of 8+ parameters, whole tree",
    "broad_excepts": "broad excepts in torchtitan/",
    "prints": "print calls in torchtitan/",
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tree", default=".")
    p.add_argument("--list", action="store_true", help="also list every site")
    args = p.parse_args()
    found = counts(os.path.abspath(args.tree))
    for key, label in LABELS.items():
        print(f"{len(found[key]):5d}  {label}")
        if args.list:
            for site in found[key]:
                print(f"         {site}")


if __name__ == "__main__":
    main()
