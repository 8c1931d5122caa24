"""docs/tests.md's claims table stays true: every test and parity case it names exists, its
`make test` column names only what `make test` runs (nothing marked slow), its `make test-slow`
column only what is marked slow, every claim has at least one test in `make test`, and every
file the page names exists.

A table cell names tests in backticks: `test_x.py` (a file of tests/unit or tests/integration:
their basenames are unique), `test_x.py::test_f` (a test function, any of its parameters),
`test_x.py::test_f[id]` (one parameter set, pytest's id) or `case:NAME` (a parity case of
tests/integration/parity_cases.py, checked against its 1-rank reference by
test_parity_suite.py). Test modules are imported, not run: the marks are read from the
functions (pytest.mark.slow on the function or on a pytest.param)."""

import enum
import importlib
import itertools
import os
import re
import sys
from collections import Counter

import pytest
from _pytest.mark.structures import ParameterSet

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "tests.md")
FOLDERS = [os.path.join(ROOT, "tests", "unit"), os.path.join(ROOT, "tests", "integration")]
HEADER = ("claim", "from", "in `make test`", "also in `make test-slow`")
NONE = "-"  # an empty cell


def table_rows(text: str) -> list[list[str]]:
    """The claims table's rows (cells stripped), found by its header."""
    lines = text.splitlines()
    header = [
        i
        for i, line in enumerate(lines)
        if tuple(c.strip() for c in line.strip().strip("|").split("|")) == HEADER
    ]
    if not header:
        return []
    start, rows = header[0], []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def _test_path(basename: str) -> str:
    found = [
        os.path.join(f, basename) for f in FOLDERS if os.path.isfile(os.path.join(f, basename))
    ]
    assert len(found) == 1, f"{basename}: in {len(found)} test folders"
    return found[0]


def module(basename: str):
    _test_path(basename)
    for folder in FOLDERS:  # the integration tests' helpers (run_tests, ...) and the unit ones
        if folder not in sys.path:
            sys.path.append(folder)
    return importlib.import_module(basename[: -len(".py")])


def _from_value(value) -> str | None:
    """pytest's id of a parameter value, where it makes one from the value itself."""
    if isinstance(value, (str, bytes)):
        text = value if isinstance(value, str) else value.decode("latin-1")
        return text.encode("unicode_escape").decode("ascii")
    if value is None or isinstance(value, (bool, int, float, complex)):
        return str(value)
    if isinstance(value, re.Pattern):
        return value.pattern
    if isinstance(value, enum.Enum):
        return str(value)
    if isinstance(getattr(value, "__name__", None), str):
        return value.__name__
    return None


def _param_id(value, argname: str, index: int, idfn) -> str:
    """pytest's id of one value of a parameter set: from `ids=` (a function), else from the
    value (a string of at most 100 characters, a number, an enum, a name), else argname+index."""
    if idfn is not None:
        made = idfn(value)
        made = None if made is None else _from_value(made)
        if made is not None:
            return made
    if isinstance(value, (str, bytes)) and len(value) > 100:
        return f"{argname}{index}"
    made = _from_value(value)
    return f"{argname}{index}" if made is None else made


def _unique(ids: list[str]) -> list[str]:
    """pytest's suffixes for ids that occur more than once."""
    counts, next_suffix, out = Counter(ids), Counter(), list(ids)
    for i, pid in enumerate(ids):
        if counts[pid] > 1:
            sep = "_" if pid and pid[-1].isdigit() else ""
            new = f"{pid}{sep}{next_suffix[pid]}"
            while new in set(ids):
                next_suffix[pid] += 1
                new = f"{pid}{sep}{next_suffix[pid]}"
            out[i] = new
            next_suffix[pid] += 1
    return out


def items(func) -> dict[str | None, bool]:
    """id -> marked slow, for every parameter set of a test function (id None: no parameters)."""
    marks = list(getattr(func, "pytestmark", []))
    slow = any(m.name == "slow" for m in marks)
    grids = []
    for mark in (m for m in marks if m.name == "parametrize"):  # nearest the function first
        argnames, argvalues = mark.args[0], mark.args[1]
        if isinstance(argnames, str):
            argnames = [a.strip() for a in argnames.split(",") if a.strip()]
        ids = mark.kwargs.get("ids")
        idfn = ids if callable(ids) else None
        grid_ids, grid_slow = [], []
        for i, v in enumerate(argvalues):
            if isinstance(v, ParameterSet):
                values, pmarks, pid = v.values, v.marks, v.id
            else:
                values, pmarks, pid = (v if len(argnames) > 1 else (v,)), (), None
            if pid is None and ids is not None and idfn is None and ids[i] is not None:
                pid = _from_value(ids[i])
            if pid is None:
                pid = "-".join(_param_id(x, n, i, idfn) for x, n in zip(values, argnames))
            grid_ids.append(pid)
            grid_slow.append(any(m.name == "slow" for m in pmarks))
        grids.append(list(zip(_unique(grid_ids), grid_slow)))
    if not grids:
        return {None: slow}
    return {
        "-".join(c[0] for c in combo): slow or any(c[1] for c in combo)
        for combo in itertools.product(*grids)
    }


def _module_is_slow(mod) -> bool:
    marks = getattr(mod, "pytestmark", [])
    return any(m.name == "slow" for m in (marks if isinstance(marks, list) else [marks]))


def speeds(name: str) -> set[bool]:
    """The marks (slow: True) of what `name` refers to; fails when it does not exist."""
    if name.startswith("case:"):
        import parity_cases

        case = parity_cases.BY_NAME.get(name[len("case:") :])
        assert case is not None, f"{name}: no such parity case"
        return {case.slow}
    path, _, test = name.partition("::")
    assert path.endswith(".py"), f"{name}: not a test file"
    mod = module(os.path.basename(path))
    if _module_is_slow(mod):
        return {True}
    if not test:
        found = [items(f) for n, f in vars(mod).items() if n.startswith("test") and callable(f)]
        assert found, f"{name}: no tests"
        return {slow for grid in found for slow in grid.values()}
    func_name, _, param = test.partition("[")
    func = getattr(mod, func_name, None)
    assert callable(func), f"{name}: no test {func_name} in {path}"
    grid = items(func)
    if not param:
        return set(grid.values())
    param = param[:-1]
    assert param in grid, f"{name}: no parameter set {param!r}; there are {sorted(grid)}"
    return {grid[param]}


ROWS = table_rows(open(DOC).read())


def test_the_table_has_claims():
    assert len(ROWS) >= 40
    assert all(len(r) == len(HEADER) for r in ROWS), [r for r in ROWS if len(r) != len(HEADER)]


@pytest.mark.parametrize("row", ROWS, ids=[r[0][:60] for r in ROWS])
def test_every_claim_is_proven_in_make_test(row):
    claim, source, fast, slow = row
    assert names(fast), f"{claim!r}: no test in `make test`"
    for name in names(fast):
        assert False in speeds(name), f"{claim!r}: {name} does not run in `make test`"
    for name in names(slow):
        assert True in speeds(name), f"{claim!r}: {name} is not marked slow"
    assert names(slow) or slow == NONE, f"{claim!r}: write {NONE} for no slow test"
    for doc in re.split(r",\s*", source):
        assert os.path.isfile(os.path.join(ROOT, "docs", doc)) or doc == "README.md", (claim, doc)


def test_every_file_the_page_names_exists():
    text = open(DOC).read()
    paths = set(re.findall(r"`((?:tests|scripts|docs|torchtitan)/[\w./-]+)`", text))
    assert paths
    missing = [p for p in sorted(paths) if not os.path.exists(os.path.join(ROOT, p))]
    assert not missing, missing
