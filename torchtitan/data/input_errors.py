"""Which exceptions are a fault of the input (one line, exit 2) and which are a bug of ours (its
traceback). Torch-free, imports nothing: a library's classes are recognised by their module.

An input fault is what reading a dataset raises when the dataset is bad or out of reach:
- OSError: missing or unreadable file, no network, an HTTP error (requests' and
  huggingface_hub's errors derive from it);
- ValueError: a parse error of the user's file (json, UnicodeDecodeError, pyarrow's
  ArrowInvalid, pandas' EmptyDataError), a split or config name that does not exist;
- EOFError, zlib.error: a truncated or corrupt compressed file;
- an error class of a library that reads datasets (DatasetsError, ArrowException, httpx's);
- a RuntimeError raised inside `datasets` itself ("Dataset scripts are no longer supported").
Anything else (TypeError, AttributeError, KeyError, ZeroDivisionError, a RuntimeError of our
own code...) is not about the input: the caller lets it through.
"""

from __future__ import annotations

import zlib

_STDLIB_FAULTS = (OSError, ValueError, EOFError, zlib.error)

# Top-level packages whose own exception classes report on the data they read or fetch.
_READER_PACKAGES = frozenset(
    {"datasets", "pyarrow", "huggingface_hub", "fsspec", "httpx", "httpx2", "requests", "urllib3"}
)

# Packages whose RuntimeError (raised in their own code) is about the input.
_RUNTIME_ERROR_PACKAGES = frozenset({"datasets"})


def _package(module: str) -> str:
    return module.partition(".")[0]


def _raised_in(e: BaseException) -> str:
    """The top-level package of the function that raised `e` ('' without a traceback)."""
    tb = e.__traceback__
    if tb is None:
        return ""
    while tb.tb_next is not None:
        tb = tb.tb_next
    return _package(tb.tb_frame.f_globals.get("__name__", ""))


def input_fault(e: BaseException) -> bool:
    """True when `e`, raised while opening or reading a dataset, says the dataset is bad."""
    if isinstance(e, _STDLIB_FAULTS):
        return True
    if any(_package(c.__module__) in _READER_PACKAGES for c in type(e).__mro__):
        return True
    return isinstance(e, RuntimeError) and _raised_in(e) in _RUNTIME_ERROR_PACKAGES
