"""Unit tests stay in their process: no file of tests/unit imports subprocess or
multiprocessing (torch.multiprocessing and torchrun's own modules included), calls os's
process starters, or names a launcher (run_train.sh, torchrun) as a command. Every file is
read with `ast` (nothing is imported); a test that starts a process belongs in
tests/integration."""

import ast
import os

import pytest

UNIT = os.path.dirname(os.path.abspath(__file__))

# Modules that start processes: importing one (or a module inside it) is a finding.
PROCESS_MODULES = (
    "subprocess",
    "multiprocessing",
    "torch.multiprocessing",
    "torch.distributed.run",
    "torch.distributed.launch",
    "torch.distributed.elastic.multiprocessing",
)
# Functions that start (or become) another process: named as module.function.
PROCESS_FUNCTIONS = {
    "os": (
        "system",
        "popen",
        "fork",
        "forkpty",
        "posix_spawn",
        "posix_spawnp",
        "spawnl",
        "spawnle",
        "spawnlp",
        "spawnlpe",
        "spawnv",
        "spawnve",
        "spawnvp",
        "spawnvpe",
        "execl",
        "execle",
        "execlp",
        "execlpe",
        "execv",
        "execve",
        "execvp",
        "execvpe",
    ),
    "pty": ("fork", "spawn"),
    "asyncio": ("create_subprocess_exec", "create_subprocess_shell"),
    "concurrent.futures": ("ProcessPoolExecutor",),
}
STARTERS = {f"{module}.{name}" for module, names in PROCESS_FUNCTIONS.items() for name in names}
# Launchers: a string whose first word is one of them (a path ending in one included) is a command.
LAUNCHERS = ("run_train.sh", "torchrun")


def _is_process_module(name: str) -> bool:
    return any(name == m or name.startswith(m + ".") for m in PROCESS_MODULES)


def _dotted(node: ast.AST) -> str | None:
    """`a.b.c` for an attribute chain that starts at a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _launcher(text: str) -> str | None:
    words = text.split()
    name = os.path.basename(words[0]) if words else ""
    return name if name in LAUNCHERS else None


def findings(path: str) -> list[str]:
    """Each way `path` starts a process, as 'line: what'."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    # bare strings (docstrings, comments in quotes) run nothing
    prose = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    out = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            out += [(line, f"imports {a.name}") for a in node.names if _is_process_module(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if _is_process_module(node.module):
                out.append((line, f"imports {node.module}"))
            else:
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    if _is_process_module(full) or full in STARTERS:
                        out.append((line, f"imports {full}"))
        elif isinstance(node, ast.Attribute) and (name := _dotted(node)) is not None:
            # the shortest part that matches: torch.multiprocessing.spawn is one finding (uses
            # torch.multiprocessing); subprocess.run none, its import is the finding
            if (_is_process_module(name) or name in STARTERS) and not (
                _is_process_module(name.rsplit(".", 1)[0]) or name.rsplit(".", 1)[0] in STARTERS
            ):
                out.append((line, f"uses {name}"))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = _dotted(node.func) or ""
            if (
                func in ("__import__", "import_module", "importlib.import_module")
                and isinstance(node.args[0].value, str)
                and _is_process_module(node.args[0].value)
            ):
                out.append((line, f"imports {node.args[0].value}"))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            if (launcher := _launcher(node.value)) is not None:
                out.append((line, f"names {launcher}"))
    return [f"{line}: {what}" for line, what in sorted(set(out))]


def scan(folder: str, skip: tuple[str, ...] = ()) -> tuple[dict[str, list[str]], list[str]]:
    """findings() of every .py file under `folder` (but `skip`) that has any, by path relative
    to `folder`; and the paths of the files read."""
    found, read = {}, []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            path = os.path.join(root, name)
            if name.endswith(".py") and path not in skip:
                read.append(path)
                if got := findings(path):
                    found[os.path.relpath(path, folder)] = got
    return found, read


def assert_no_process_started(folder: str, skip: tuple[str, ...] = ()) -> list[str]:
    """Fails naming each file under `folder` that starts a process; returns the files read."""
    found, read = scan(folder, skip)
    assert found == {}, (
        "these files start processes (move their tests to tests/integration): " + repr(found)
    )
    return read


def test_no_unit_test_starts_a_process():
    # this file names what it looks for; it imports none of it
    read = assert_no_process_started(UNIT, skip=(os.path.abspath(__file__),))
    names = {os.path.basename(p) for p in read}
    assert {"conftest.py", "config_helpers.py", "test_config.py"} <= names, sorted(
        names
    )  # it read them


def test_the_reader_finds_each_way_of_starting_a_process(tmp_path):
    (tmp_path / "test_spawns.py").write_text(
        "import os, subprocess\n"  # 1
        "import multiprocessing.pool as pool\n"  # 2
        "import torch.multiprocessing as mp\n"  # 3
        "from torch import multiprocessing\n"  # 4
        "from subprocess import run\n"  # 5
        "from os import fork\n"  # 6
        "from concurrent.futures import ProcessPoolExecutor\n"  # 7
        "import torch\n"  # 8
        "def test_it(repo_root):\n"  # 9
        "    torch.multiprocessing.spawn(print, nprocs=2)\n"  # 10
        "    os.system('true')\n"  # 11
        "    subprocess.run([os.path.join(repo_root, 'run_train.sh'), '--training.steps=1'])\n"  # 12
        "    cmd = ['torchrun', '--nproc_per_node=2', 'x.py']\n"  # 13
        "    script = f'{repo_root}/run_train.sh --training.steps=1'\n"  # 14
        "    __import__('subprocess')\n"  # 15
    )
    assert findings(str(tmp_path / "test_spawns.py")) == [
        "1: imports subprocess",
        "2: imports multiprocessing.pool",
        "3: imports torch.multiprocessing",
        "4: imports torch.multiprocessing",
        "5: imports subprocess",
        "6: imports os.fork",
        "7: imports concurrent.futures.ProcessPoolExecutor",
        "10: uses torch.multiprocessing",
        "11: uses os.system",
        "12: names run_train.sh",
        "13: names torchrun",
        "14: names run_train.sh",
        "15: imports subprocess",
    ]
    with pytest.raises(AssertionError, match="test_spawns.py"):
        assert_no_process_started(str(tmp_path))


def test_the_reader_passes_in_process_code(tmp_path):
    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub" / "test_in_process.py"
    path.write_text(
        '"""Prose may name run_train.sh and torchrun; so may comments."""\n'
        "import os\n"
        "import signal\n"
        "import torch.distributed as dist\n"
        "from torchtitan.launcher import workers\n"
        "def test_it(subprocess_env, capsys):\n"
        "    '''torchrun starts the ranks.'''\n"
        "    # run_train.sh builds this argv\n"
        "    assert capsys.readouterr().out.startswith('usage: run_train.sh [--section.key=value ...]')\n"
        "    os.kill(os.getpid(), 0), signal.getsignal(signal.SIGTERM), os.path.join('a', 'b')\n"
    )
    assert findings(str(path)) == []
    assert assert_no_process_started(str(tmp_path)) == [str(path)]  # subfolders are read too
