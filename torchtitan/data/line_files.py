"""Local text and JSON Lines files, read by their line index (documents.IndexedText): which
files are, the index of their lines, a line parsed, and the first records as the config check
reads them. Torch-free; numpy is imported by the one function that scans a file.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from torchtitan.messages import one_line

if TYPE_CHECKING:
    import numpy as np

INDEX_BLOCK = 8 << 20
INDEXED_SUFFIXES = (".jsonl", ".json", ".txt")


def line_starts(path: str) -> tuple[np.ndarray, np.ndarray, int]:
    """(starts, ends) byte offsets of the non-blank lines of `path`, and the bytes scanned."""
    import numpy as np  # here, not at the top: the config check scans no file

    starts, ends = [], []
    pos, carry_start = 0, 0
    with open(path, "rb", buffering=0) as f:
        while True:
            block = f.read(INDEX_BLOCK)
            if not block:
                break
            nl = np.flatnonzero(np.frombuffer(block, np.uint8) == 10) + pos
            if len(nl):
                starts.append(np.concatenate(([carry_start], nl[:-1] + 1)))
                ends.append(nl)
                carry_start = int(nl[-1]) + 1
            pos += len(block)
    if carry_start < pos:  # a last line without a newline
        starts.append(np.array([carry_start]))
        ends.append(np.array([pos]))
    s = np.concatenate(starts) if starts else np.zeros(0, np.int64)
    e = np.concatenate(ends) if ends else np.zeros(0, np.int64)
    short = np.flatnonzero(e - s < 8)  # blank lines are short: look at those only
    if len(short):
        with open(path, "rb") as f:
            blank = [
                i for i in short if not os.pread(f.fileno(), int(e[i] - s[i]), int(s[i])).strip()
            ]
        keep = np.ones(len(s), bool)
        keep[blank] = False
        s, e = s[keep], e[keep]
    return s.astype(np.int64), e.astype(np.int64), pos


def is_indexed_file(path: str) -> bool:
    """A local file the run reads by its line index: .txt, or JSON Lines (.jsonl/.json whose
    first line holds a JSON object)."""
    return (
        os.path.isfile(path)
        and path.endswith(INDEXED_SUFFIXES)
        and (path.endswith(".txt") or _is_json_lines(path))
    )


def parse_line(raw: bytes, json_lines: bool) -> dict:
    """One line of an indexed file as a record ({"text": line} for .txt); ValueError if not JSON."""
    if not json_lines:
        return {"text": raw.decode("utf-8", "replace").rstrip("\r\n")}
    return json.loads(raw)


def first_records(path: str, limit: int) -> list[dict]:
    """The first `limit` records of an indexed file, parsed as the run parses them (the config
    check's read); ValueError naming the line when one is not JSON."""
    json_lines, out = not path.endswith(".txt"), []
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            if len(out) >= limit:
                break
            if not raw.strip():
                continue
            try:
                out.append(parse_line(raw, json_lines))
            except ValueError as e:
                raise ValueError(f"line {n} is not JSON: {one_line(e, 120)}") from None
    return out


def _is_json_lines(path: str) -> bool:
    if not os.access(path, os.R_OK):
        return True  # unreadable: read as JSON Lines, whose reader says so in one line
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                try:
                    return isinstance(json.loads(line), dict)
                except ValueError:
                    return False
    return True
