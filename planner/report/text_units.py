"""What every text report shares: the console the CLI prints on, a strategy's short label and the units
figures are written in (``planner.report.text`` is the face of the text reports)."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console

from store.records import RLHFStrategy, Strategy

__all__ = ["GIB", "console", "describe", "gib", "pct", "seconds", "size_text"]

console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)
GIB = 2**30


def describe(strategy: dict[str, Any], roles: dict[str, Any] | None = None) -> str:
    """A short label of a strategy document, single-model or RLHF (``roles``: the job's, from its workload
    document; a frozen model the job does not hold is labelled absent)."""
    if "actor" in strategy:
        return RLHFStrategy.from_dict(strategy).describe(roles)
    return Strategy.from_dict(strategy).describe()


def gib(n: float) -> str:
    """Bytes in GiB, two decimals."""
    return f"{n / GIB:.2f} GiB"


def seconds(s: float) -> str:
    """Seconds, or milliseconds under one."""
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.2f} s"


def pct(value: float | None) -> str:
    """A relative error as a signed whole percent; ``-`` where there is none."""
    return "-" if value is None else f"{100 * value:+.0f}%"


def size_text(n: float) -> str:
    """Bytes in the largest binary unit that keeps a whole number before the point."""
    for unit, scale in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"
