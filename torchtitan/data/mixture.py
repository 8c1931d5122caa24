"""Weighted mixtures of datasets: `[training] dataset_mix = ["a.jsonl:0.7", "hub/name:0.3"]`.

Weights are shares of tokens. Every window has seq_len + 1 tokens, so a share of windows is a
share of tokens: window n of the job (step t, row i: n = t x G + i) comes from the source
`pattern[n % P]`, where the pattern spreads each source's quota (its weight x P, rounded by
largest remainder) evenly over a period P, a prime that does not divide G (so every row cycles
through the whole pattern and reads each source at its weight). Deterministic, layout-invariant
(it depends on G only), nothing to checkpoint, and the tokens each source gave up to any step
come from a formula. Torch-free: the config check parses the same entries.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

PERIODS = (1009, 1013, 1019, 1021)


class MixError(ValueError):
    """An entry that cannot be used; the message is one line without the key."""


@dataclass(frozen=True)
class MixSource:
    dataset: str
    weight: float
    name: str  # for logs and metric keys


def parse_mix(entries: list[str]) -> list[MixSource]:
    """'dataset:weight' entries -> sources with normalised weights (a dataset name may hold colons;
    the weight follows the last one)."""
    if not entries:
        return []
    out, names = [], set()
    for entry in entries:
        dataset, sep, weight = str(entry).rpartition(":")
        if not sep or not dataset:
            raise MixError(f"entry {entry!r} is not 'dataset:weight' (e.g. 'data/web.jsonl:0.7')")
        try:
            w = float(weight)
        except ValueError:
            raise MixError(f"entry {entry!r}: weight {weight!r} is not a number") from None
        if not w > 0 or w != w or w == float("inf"):
            raise MixError(f"entry {entry!r}: weight {weight} must be a positive number")
        base = os.path.basename(os.path.normpath(dataset)) or dataset
        name = base.split(".")[0] or base
        while name in names:
            name += "_"
        names.add(name)
        out.append(MixSource(dataset, w, name))
    total = sum(s.weight for s in out)
    return [MixSource(s.dataset, s.weight / total, s.name) for s in out]


def period(num_slots: int) -> int:
    return next(p for p in PERIODS if num_slots % p)


def quotas(weights: list[float], p: int) -> list[int]:
    """Windows per period for each source: largest remainder, each source at least one."""
    exact = [w * p for w in weights]
    q = [max(1, int(x)) for x in exact]
    order = sorted(range(len(q)), key=lambda k: exact[k] - int(exact[k]), reverse=True)
    i = 0
    while sum(q) < p:
        q[order[i % len(q)]] += 1
        i += 1
    while sum(q) > p:
        k = max(range(len(q)), key=lambda k: q[k] - exact[k])
        q[k] -= 1
    return q


def pattern(weights: list[float], num_slots: int) -> list[int]:
    """Source of each window of one period: smooth weighted round robin over the quotas."""
    p = period(num_slots)
    q = quotas(weights, p)
    credit = [0] * len(q)
    out = []
    for _ in range(p):
        for k in range(len(q)):
            credit[k] += q[k]
        k = max(range(len(q)), key=lambda k: credit[k])
        credit[k] -= p
        out.append(k)
    return out


def windows_by_source(pat: list[int], windows: int) -> list[int]:
    """How many of the job's first `windows` windows each source gave."""
    full, rest = divmod(windows, len(pat))
    counts = [0] * (max(pat) + 1)
    for k in pat:
        counts[k] += full
    for k in pat[:rest]:
        counts[k] += 1
    return counts
