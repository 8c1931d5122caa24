"""The library's logging: every module logs through `logging.getLogger(__name__)` (a child of
the "torchtitan" logger); the entry points (the trainer, the dry run, the checks' CLI) call
`setup()` once. Torch-free, imports nothing of ours.

What `setup` installs on the "torchtitan" logger:

- INFO and DEBUG to stdout, WARNING and above to stderr, each line the bare message (the
  console format users and tests read is the message itself; torchrun prefixes the rank when
  it shows several ranks' output);
- every record carries `rank` (the process's RANK, 0 without torchrun), for handlers a user
  adds (e.g. a file handler with "%(rank)s: %(message)s"); which ranks' console is shown is
  run_train.sh's LOG_RANK (torchrun's filter), so every rank logs alike;
- the streams are looked up when a line is written (sys.stdout / sys.stderr as they are
  then: pytest's capture, a redirected stream);
- a level from `TORCHTITAN_LOG_LEVEL` (default INFO).
"""

from __future__ import annotations

import logging
import os
import sys

ROOT = "torchtitan"
_HANDLERS: list[logging.Handler] = []


class _Rank(logging.Filter):
    """Stamps each record with the process's rank."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = self.rank
        return True


class _Console(logging.StreamHandler):
    """A handler on sys.stdout or sys.stderr as they are when a line is written."""

    def __init__(self, name: str) -> None:
        self._stream_name = name
        super().__init__()

    @property
    def stream(self):
        return getattr(sys, self._stream_name)

    @stream.setter
    def stream(self, _value) -> None:  # StreamHandler.__init__ assigns one; ours is looked up
        pass


class _Below(logging.Filter):
    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < self.level


def setup(rank: int | None = None) -> logging.Logger:
    """Configure the "torchtitan" logger for this process (idempotent: a second call
    replaces the first's handlers, e.g. after the rank is known)."""
    logger = logging.getLogger(ROOT)
    for h in _HANDLERS:
        logger.removeHandler(h)
    _HANDLERS.clear()
    rank = int(os.environ.get("RANK", "0")) if rank is None else rank
    ranks = _Rank(rank)
    out = _Console("stdout")
    out.addFilter(_Below(logging.WARNING))
    err = _Console("stderr")
    err.setLevel(logging.WARNING)
    for h in (out, err):
        h.setFormatter(logging.Formatter("%(message)s"))
        h.addFilter(ranks)
        logger.addHandler(h)
        _HANDLERS.append(h)
    logger.setLevel(os.environ.get("TORCHTITAN_LOG_LEVEL", "INFO").upper())
    logger.propagate = False  # a user's root handlers would print every line twice
    return logger


def flush() -> None:
    """Flush the console handlers (before a process exits or forks)."""
    for h in _HANDLERS:
        h.flush()
