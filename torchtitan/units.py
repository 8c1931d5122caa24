"""Byte units, defined once."""

MIB = 2**20
GIB = 2**30


def gib_text(n_bytes: float) -> str:
    """1,953.1: GiB with one decimal and thousands separators (messages)."""
    return f"{n_bytes / GIB:,.1f}"
