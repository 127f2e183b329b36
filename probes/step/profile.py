"""Where a probe's time goes: one more step after the measured ones, each phase under ``torch.profiler``.

``MEMPLAN_PROFILE=1`` in the planner's environment (the child inherits it) makes the child run one step
after its measured steps with every phase inside its own ``torch.profiler.profile`` (CPU activity, and CUDA
on a CUDA probe). That step is not measured (the profiler adds host time of its own); its summary per phase
goes to ``extra["profile"]`` (:func:`summarize`):

- ``wall_s``: the phase's host time under the profiler;
- ``kernels``, ``device_busy_s`` (the sum of the device's kernel and copy durations) and ``device_active_s``
  (their union on the timeline: a phase whose active time is well under its wall time waits on the host);
- ``device_s_by_kind``: device time per kind of kernel (:func:`kernel_kind`: matrix products, attention,
  collectives, copies each way, memset, the rest);
- ``top_device`` and ``top_host``: the operators and kernels with the most self device / self host time
  (name, calls, microseconds).

On the CPU only the host columns fill. Nothing here imports torch at module level.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["PROFILE_ENV", "PhaseProfiler", "kernel_kind", "profile_enabled", "summarize", "union_seconds"]

PROFILE_ENV = "MEMPLAN_PROFILE"
TOP_ROWS = 25

# substrings of a kernel's name, checked in this order (lower case); the first that matches names its kind
_KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("copy_host_to_device", ("memcpy htod",)),
    ("copy_device_to_host", ("memcpy dtoh",)),
    ("copy_device_to_device", ("memcpy dtod", "memcpy ptop")),
    ("memset", ("memset",)),
    ("collective", ("nccl",)),
    ("attention", ("flash", "fmha", "attention", "efficient_attention", "mem_eff")),
    ("matmul", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "sm90_", "sm80_", "ampere_", "volta_", "turing_")),
)


def profile_enabled() -> bool:
    """Whether ``MEMPLAN_PROFILE`` asks for the profiled step (off unless set to 1/true/yes/on)."""
    return os.environ.get(PROFILE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def kernel_kind(name: str) -> str:
    """The kind of a device kernel or copy by its name (see ``device_s_by_kind``); ``other`` if none fits."""
    lowered = name.lower()
    for kind, parts in _KINDS:
        if any(part in lowered for part in parts):
            return kind
    return "other"


def union_seconds(intervals: Iterable[tuple[float, float]]) -> float:
    """Seconds covered by the union of ``(start_us, end_us)`` intervals."""
    total = 0.0
    end_seen = float("-inf")
    for start, end in sorted(intervals):
        if end <= end_seen:
            continue
        total += end - max(start, end_seen)
        end_seen = end
    return total / 1e6


class PhaseProfiler:
    """Profiles phases one by one (:meth:`phase`) and keeps each one's :func:`summarize` in :attr:`phases`."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.phases: dict[str, dict[str, Any]] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        import time

        import torch

        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
            torch.cuda.synchronize()
        with torch.profiler.profile(activities=activities) as prof:
            start = time.perf_counter()
            yield
            if self.device == "cuda":
                torch.cuda.synchronize()
            wall = time.perf_counter() - start
        summary = summarize(prof, self.device)
        summary["wall_s"] = round(wall, 6)
        if name in self.phases:  # a phase that repeats in a step (grad_accum micro-steps): add its runs up
            summary = _add(self.phases[name], summary)
        self.phases[name] = summary


def summarize(prof: Any, device: str) -> dict[str, Any]:
    """One profiled phase in numbers (see the module docstring); ``prof`` is a finished ``torch.profiler``."""
    import torch

    averages = prof.key_averages()
    host = sorted(averages, key=lambda e: -e.self_cpu_time_total)[:TOP_ROWS]
    out: dict[str, Any] = {
        "top_host": [[e.key, e.count, round(e.self_cpu_time_total, 1)] for e in host],
        "host_ops": sum(e.count for e in averages),
    }
    if device != "cuda":
        return out
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_kind: dict[str, float] = {}
    for event in kernels:
        kind = kernel_kind(event.name)
        by_kind[kind] = by_kind.get(kind, 0.0) + event.time_range.elapsed_us() / 1e6
    top = sorted(averages, key=lambda e: -e.self_device_time_total)[:TOP_ROWS]
    out.update(
        kernels=len(kernels),
        device_busy_s=round(sum(by_kind.values()), 6),
        device_active_s=round(union_seconds((e.time_range.start, e.time_range.end) for e in kernels), 6),
        device_s_by_kind={kind: round(seconds, 6) for kind, seconds in sorted(by_kind.items())},
        top_device=[[e.key, e.count, round(e.self_device_time_total, 1)] for e in top if e.self_device_time_total],
    )
    return out


def _add(seen: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Two runs of one phase: times and counts summed, the top rows of the first run kept."""
    merged = dict(seen)
    for key in ("wall_s", "kernels", "device_busy_s", "device_active_s", "host_ops"):
        if key in new:
            merged[key] = round(seen.get(key, 0) + new[key], 6)
    kinds = dict(seen.get("device_s_by_kind", {}))
    for kind, seconds in new.get("device_s_by_kind", {}).items():
        kinds[kind] = round(kinds.get(kind, 0.0) + seconds, 6)
    if kinds:
        merged["device_s_by_kind"] = kinds
    merged["runs"] = seen.get("runs", 1) + 1
    return merged
