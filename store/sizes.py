"""Memory sizes as people type them: ``24G``, ``24GB`` and ``24GiB`` all mean 24 x 2^30 bytes.

GPU vendors' "GB" are GiB (an "80 GB" A100 has 80 x 2^30 bytes), so every unit here is binary.
"""

from __future__ import annotations

import re
from decimal import Decimal

from store.errors import InputError

_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


MAX_SIZE = 2**50  # 1 PiB: beyond any GPU's or node's memory; larger numbers are typos, not sizes


def parse_size(text: str | int, what: str = "size") -> int:
    """Bytes in ``text`` (``24G``, ``24GB``, ``24GiB``, ``24576MiB``, ``25769803776``).

    Raises InputError for anything that is not a positive size of at most 1 PiB.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        shown = str(text) if len(str(text)) <= 40 else str(text)[:37] + "..."
        match = _PATTERN.match(str(text)) if len(str(text)) <= 400 else None
        if not match:
            raise InputError(
                f"{what}: cannot read {shown!r} as a memory size; write it like 24G, 24GiB, 24576MiB or 25769803776"
            )
        value = int(Decimal(match.group(1)) * _UNITS[match.group(2).upper()])
    if value <= 0:
        raise InputError(f"{what}: {text!r} must be larger than zero")
    if value > MAX_SIZE:
        amount = format_bytes(value) if value < 2**80 else "that"
        raise InputError(f"{what}: {amount} is more than 1 PiB; give the memory of one GPU or one node")
    return value


def format_bytes(n: int | float) -> str:
    """Bytes in the largest binary unit that keeps the number at least 1 (``22.35 GiB``)."""
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{sign}{n / scale:.2f} {unit}"
    return f"{sign}{int(n)} B"


def describe_size(text: str | int, n: int) -> str:
    """How ``text`` was read: ``24G read as 24.00 GiB (25769803776 bytes)``."""
    return f"{text} read as {format_bytes(n)} ({n} bytes)"
