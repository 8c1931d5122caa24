"""The folders of torchtitan/ are its architecture: each layer imports only the layers below it.

Every module's imports are read with `ast` (nothing is imported), lazy imports inside
functions and `TYPE_CHECKING` imports included: a name a lower layer uses is a dependency
too. The test fails on an import that points up the layer order or closes a cycle between
modules. `python tests/unit/test_import_layers.py` prints the graph's summary.
"""

from __future__ import annotations

import ast
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(ROOT, "torchtitan")

# Bottom first. A module's layer is its first folder under torchtitan/ (or, for a top-level
# module, its own name). A layer may import its own layer and every layer listed before it.
LAYERS: tuple[tuple[str, ...], ...] = (
    (
        "dtypes",
        "messages",
        "units",
        "hardware",
        "log",
    ),  # base: names, formats, the GPU table, logging; torch-free
    ("config",),  # job_config.py + manager.py: torch-free, imports nothing of ours
    (
        "distributed",
    ),  # mesh, plan, reshard policy, FSDP2 / SimpleFSDP / DDP, AC, TP, PP, CP, EP: no model
    ("models",),  # registry, model protocol + train spec, flavors, shapes, common/, each model, hf/
    ("data",),  # tokenizer, corpus, sources, datasets, dataloader, validation data
    ("resilience",),  # preemption, hang watchdog + report, exit status, fault injection
    ("observe",),  # metrics fan-out, profiler, comm stats, memory meters
    ("checkpoint",),  # DCP manager, files + markers, async saves, state objects
    ("training",),  # the build path, the step, the loss, the optimizer, expert balance, plan report
    # planning/: what is decided before launch, one sub-layer per concern, bottom first
    ("planning.simulate",),  # one simulated step of one pipeline rank; which roles are simulated
    (
        "planning.step_time",
    ),  # the trace of a simulated step, the step-time model, the local profile
    ("planning.memory",),  # peak per rank role, the budget, the model-states floor, the largest fit
    ("planning.search",),  # the layouts, the probe and composition, the search, nearby
    ("planning.startup", "planning"),  # the trainer's start-up gate (and the package's docstring)
    ("checks",),  # the pre-launch checks: each owner's torch-free rules, called in order
    (
        "train",
        "dry_run",
        "launcher",
        "hf_convert",
        "predict_rank_roles",
        "generate",
    ),  # entry points
)
LAYER_OF = {name: i for i, names in enumerate(LAYERS) for name in names}


def layer_name(index: int) -> str:
    return "/".join(LAYERS[index])


def module_files() -> dict[str, str]:
    """Module name -> file, for every .py file of the package."""
    out = {}
    for folder, _, files in os.walk(PACKAGE):
        for f in files:
            if not f.endswith(".py"):
                continue
            rel = os.path.relpath(os.path.join(folder, f), ROOT)[:-3].split(os.sep)
            if rel[-1] == "__init__":
                rel = rel[:-1]
            out[".".join(rel)] = os.path.join(folder, f)
    return out


def _resolve(name: str, modules: dict[str, str]) -> str | None:
    """The longest known module that `name` (a module or a name inside one) refers to."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in modules:
            return candidate
    return None


def imports_of(module: str, path: str, modules: dict[str, str]) -> dict[str, int]:
    """Modules of ours that `module` imports -> the first line that does."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    found: dict[str, int] = {}
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] or [base]
        for target in targets:
            if not target.startswith("torchtitan"):
                continue
            resolved = _resolve(target, modules)
            if resolved is not None and resolved != module:
                found.setdefault(resolved, node.lineno)
    return found


def layer_of(module: str) -> int | None:
    """A module's layer: its first folder under torchtitan/, or for planning/ its first two."""
    parts = module.split(".")
    if len(parts) == 1:  # the package itself
        return None
    if len(parts) > 2 and ".".join(parts[1:3]) in LAYER_OF:
        return LAYER_OF[".".join(parts[1:3])]
    return LAYER_OF.get(parts[1])


def graph() -> dict[str, dict[str, int]]:
    modules = module_files()
    return {m: imports_of(m, p, modules) for m, p in sorted(modules.items())}


def upward_imports(g: dict[str, dict[str, int]]) -> list[str]:
    out = []
    for module, targets in g.items():
        low = layer_of(module)
        for target, line in targets.items():
            high = layer_of(target)
            if low is None or high is None:
                continue
            if high > low:
                out.append(
                    f"{module}:{line} imports {target} ({layer_name(low)} -> {layer_name(high)}, up)"
                )
    return out


def cycles(g: dict[str, dict[str, int]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in g.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in g:
        if v not in index:
            visit(v)
    return out


def unplaced(g: dict[str, dict[str, int]]) -> list[str]:
    return [m for m in g if m != "torchtitan" and layer_of(m) is None]


def test_every_module_has_a_layer():
    assert unplaced(graph()) == []


def test_no_import_points_up_the_layers():
    assert upward_imports(graph()) == []


def test_no_import_cycle():
    assert cycles(graph()) == []


def test_the_package_has_no_components_folder():
    assert not os.path.exists(os.path.join(PACKAGE, "components"))


def test_layer_reader_sees_lazy_type_checking_and_relative_imports(tmp_path):
    """The reader itself: what it must catch."""
    code = (
        "from __future__ import annotations\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from torchtitan.training.step import StepRunner\n"
        "def f():\n"
        "    import torchtitan.planning.memory.predict\n"
        "from ..config import manager\n"
        "from . import plan\n"
    )
    path = tmp_path / "mod.py"
    path.write_text(code)
    modules = {
        m: ""
        for m in (
            "torchtitan.training.step",
            "torchtitan.planning.memory.predict",
            "torchtitan.config.manager",
            "torchtitan.distributed.plan",
            "torchtitan.distributed.mod",
            "torchtitan.config",
        )
    }
    found = imports_of("torchtitan.distributed.mod", str(path), modules)
    assert set(found) == {
        "torchtitan.training.step",
        "torchtitan.planning.memory.predict",
        "torchtitan.config.manager",
        "torchtitan.distributed.plan",
    }
    ups = upward_imports({"torchtitan.distributed.mod": found})
    assert len(ups) == 2 and all("up" in u for u in ups)
    assert cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]


if __name__ == "__main__":
    g = graph()
    print("layers, bottom first:")
    for i in range(len(LAYERS)):
        members = sorted(m for m in g if layer_of(m) == i)
        print(f"  {i:2d} {layer_name(i):<30} {len(members):3d} modules")
    ups, cyc, lost = upward_imports(g), cycles(g), unplaced(g)
    print(
        f"{sum(len(t) for t in g.values())} imports between {len(g)} modules; {len(ups)} upward, {len(cyc)} cycles,"
        f" {len(lost)} modules without a layer"
    )
    for line in ups + [" <-> ".join(c) for c in cyc] + [f"no layer: {m}" for m in lost]:
        print("  " + line)
    sys.exit(1 if ups or cyc or lost else 0)
