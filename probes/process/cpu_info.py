"""py-cpuinfo's answer kept for the life of the process (DeepSpeed asks it again for every op it loads)."""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["cache_cpu_info"]


def cache_cpu_info() -> None:
    """Answer py-cpuinfo's ``get_cpu_info()`` from memory after its first call in this process.

    DeepSpeed's op builders ask it two or three times for each op they load (``cpu_arch``, ``simd_width``,
    ``DeepSpeedCPUAdam.__init__``: deepspeed/ops/op_builder/builder.py), and each call starts a Python process
    that reads CPUID (about 0.4 CPU seconds). The answer does not change while a process lives."""
    try:
        import cpuinfo  # type: ignore[import-untyped]  # py-cpuinfo, which DeepSpeed requires, ships no types
    except ImportError:
        return
    ask = cpuinfo.get_cpu_info
    if getattr(ask, "_memplan_cached", False):
        return
    known: list[dict[str, Any]] = []

    def get_cpu_info() -> dict[str, Any]:
        if not known:
            known.append(ask())
        return copy.deepcopy(known[0])  # each caller its own answer, as each call gave before

    get_cpu_info._memplan_cached = True  # type: ignore[attr-defined]
    cpuinfo.get_cpu_info = get_cpu_info
