"""The embedded default corpus ('pydoc'), built from text every CPython ships, so the default
run and the tests need no network and no download.

Split 'train': the documentation topics of `pydoc_data.topics` (~465 KB of English prose).
Split 'validation': docstrings of a fixed list of standard-library modules, their classes and
functions (held out: the topics do not contain them).
"""

MIN_DOC_CHARS = 1000

PYDOC_SPLITS = ("train", "validation")

# Pure-Python modules without import side effects, documented at length.
_VALIDATION_MODULES = (
    "argparse",
    "ast",
    "bisect",
    "calendar",
    "collections",
    "configparser",
    "csv",
    "dataclasses",
    "datetime",
    "decimal",
    "difflib",
    "enum",
    "fractions",
    "functools",
    "heapq",
    "inspect",
    "json",
    "logging",
    "pathlib",
    "pickle",
    "queue",
    "random",
    "shutil",
    "statistics",
    "string",
    "subprocess",
    "tarfile",
    "textwrap",
    "threading",
    "typing",
    "zipfile",
)


def _docstrings() -> dict[str, str]:
    """Module name -> its docstring and those of its public classes and functions, in order."""
    import importlib
    import inspect
    import warnings

    out = {}
    with (
        warnings.catch_warnings()
    ):  # typing's deprecated aliases warn when their docstrings are read
        warnings.simplefilter("ignore", DeprecationWarning)
        for name in _VALIDATION_MODULES:
            out[name] = _module_docs(importlib.import_module(name), name, inspect)
    return out


def _module_docs(module, name: str, inspect) -> str:
    parts = [inspect.getdoc(module) or ""]
    for attr in sorted(vars(module)):
        obj = getattr(module, attr)
        if attr.startswith("_") or getattr(obj, "__module__", None) != name:
            continue
        if inspect.isclass(obj) or inspect.isfunction(obj):
            parts.append(inspect.getdoc(obj) or "")
    return "\n\n".join(p for p in parts if p)


def pydoc_documents(split: str = "train") -> list[str]:
    """The split's texts cut at blank lines and regrouped into documents of >= MIN_DOC_CHARS
    characters."""
    if split not in PYDOC_SPLITS:
        raise ValueError(f"the embedded 'pydoc' dataset has splits {PYDOC_SPLITS}, not {split!r}")
    if split == "train":
        from pydoc_data.topics import topics
    else:
        topics = _docstrings()

    docs = []
    for name in sorted(topics):
        current = ""
        for para in topics[name].split("\n\n"):
            current = f"{current}\n\n{para}" if current else para
            if len(current) >= MIN_DOC_CHARS:
                docs.append(current)
                current = ""
        if current.strip():
            docs.append(current)
    return docs
