"""Memory sizes as people type them: ``24G``, ``24GB`` and ``24GiB`` all mean 24 x 2^30 bytes.

GPU vendors' "GB" are GiB (an "80 GB" A100 has 80 x 2^30 bytes), so every unit here is binary.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

from store.errors import InputError

_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
# ASCII digits only (no "٢٤G"), spaces only between the number and the unit (no "24\nG"); the unit is
# K, M, G or T with an optional B or iB, or a lone B.
_PATTERN = re.compile(r"^(\d+(?:\.\d+)?) *(?:([KMGT])(?:I?B)?|B)?$", re.IGNORECASE | re.ASCII)


MAX_SIZE = 2**50  # 1 PiB: beyond any GPU's or node's memory; larger numbers are typos, not sizes


def parse_size(text: str | int | float, what: str = "size") -> int:
    """Bytes in ``text`` (``24G``, ``24GB``, ``24GiB``, ``24576MiB``, ``25769803776``, ``1.5T``).

    Raises InputError with one line for anything that is not a positive size of at most 1 PiB: other
    units, non-ASCII digits, a line break inside, a fraction of a byte (``1.5B``; ``1.3G`` rounds down
    to whole bytes).
    """
    if isinstance(text, float) and math.isfinite(text):  # from Python callers: a whole number of bytes
        if not text.is_integer():
            raise InputError(f"{what}: {text!r} is not a whole number of bytes")
        text = int(text)
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        shown = str(text) if len(str(text)) <= 40 else str(text)[:37] + "..."
        match = _PATTERN.match(str(text).strip()) if isinstance(text, str) and len(text) <= 400 else None
        if not match:
            raise InputError(
                f"{what}: cannot read {shown!r} as a memory size; write it like 24G, 24GiB, 24576MiB or 25769803776"
            )
        number = Decimal(match.group(1))
        unit = (match.group(2) or "").upper()
        if not unit and number != number.to_integral_value():
            raise InputError(f"{what}: {shown!r} is not a whole number of bytes")
        value = int(number * _UNITS[unit])
        if value <= 0 < number:
            raise InputError(f"{what}: {shown!r} is less than one byte")
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
    return f"{' '.join(str(text).split())} read as {format_bytes(n)} ({n} bytes)"
