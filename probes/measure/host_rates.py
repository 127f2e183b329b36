"""A short benchmark of this host's memory (under 2 s): the time model's host terms measured where they run.

The time model prices host work with four rates that were one host's figures (search.coefficients): CPU Adam and
ZeRO-3's unscale and conversions stream host memory (``host_memory_gbps``), a new pageable host tensor's first
write faults in pages the kernel zeroes (``host_first_touch_gbps``), ZeRO-3 with offloaded parameters uploads
from pageable memory (``pageable_copy_gbps``), and every kernel costs its host issue time
(``host_s_per_kernel``). This measures what a CPU can measure, with torch's own CPU kernels on all its threads:

- ``host_memory_gbps``: ``dst.copy_(src)`` of :data:`BUFFER_BYTES` (with its source, beyond most last-level caches),
  counting the bytes read and written, the way the coefficient counts CPU Adam's 30 bytes per parameter (best
  of :data:`REPEATS`);
- ``host_first_touch_gbps``: :data:`TOUCH_BYTES` written into a new tensor (fresh pages from mmap: torch's CPU
  allocator takes blocks this large from the system and gives them back on free) against the same write into
  the now-touched tensor; the rate is the bytes over the difference, as the coefficient's term adds it to the
  streaming time (``search.model.zero3_time``: the H200 host's 313 ms against 104 ms for 2.6 GB);
- ``pageable_copy_gbps``: a host-to-device copy from pageable memory, which needs CUDA: measured only where a
  CUDA device is present, else not measured (the catalog's figure stays, labelled assumed);
- ``host_s_per_kernel`` is not measured here: its larger part is the CUDA launch (``cudaLaunchKernel``, the
  driver), which a CPU cannot time; ``planner calibrate`` fits it from the stored probes where they determine it.

Imports torch on first call; ``planner calibrate`` calls it (never ``recommend``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

BUFFER_BYTES = 128 * 2**20  # source and destination: 256 MiB, beyond most servers' last-level cache
TOUCH_BYTES = 64 * 2**20  # new pages per first-touch run (a gVisor host faults them in at under 1 GB/s)
REPEATS = 3
TOUCH_REPEATS = 2
CUDA_NEEDED = "needs CUDA (a host-to-device copy): not measured on a host without a CUDA device"
LAUNCH_NEEDS_CUDA = (
    "its larger part is the CUDA launch (cudaLaunchKernel, the driver), which a CPU cannot time; planner calibrate "
    "fits it from the stored probes where they determine it"
)


@dataclass(frozen=True)
class HostRates:
    """What the host benchmark measured (None: not measured, with the reason in ``why_not``)."""

    host_memory_gbps: float | None
    host_first_touch_gbps: float | None
    pageable_copy_gbps: float | None
    threads: int
    buffer_bytes: int
    seconds: float  # wall time of the whole benchmark
    why_not: dict[str, str] = field(default_factory=dict)  # coefficient name -> why it was not measured

    def measured(self) -> dict[str, float]:
        """The coefficients measured, by name (the calibration's values)."""
        rates = {
            "host_memory_gbps": self.host_memory_gbps,
            "host_first_touch_gbps": self.host_first_touch_gbps,
            "pageable_copy_gbps": self.pageable_copy_gbps,
        }
        return {name: value for name, value in rates.items() if value is not None}

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape stored with the calibration (``report["host_benchmark"]``)."""
        return {
            "measured": self.measured(),
            "why_not": dict(self.why_not),
            "threads": self.threads,
            "buffer_bytes": self.buffer_bytes,
            "seconds": round(self.seconds, 3),
            "benchmark": "probes/measure/host_rates.py",
        }


def _best(run: Any, repeats: int) -> float:
    """The least wall seconds of ``repeats`` calls of ``run``."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def _first_touch(torch: Any, nbytes: int) -> tuple[float, float]:
    """(seconds of the first write into a new tensor, seconds of the same write into it once touched), the
    least of :data:`TOUCH_REPEATS` new tensors."""
    first, touched = float("inf"), float("inf")
    for value in range(TOUCH_REPEATS):
        fresh = torch.empty(nbytes, dtype=torch.uint8)
        start = time.perf_counter()
        fresh.fill_(value + 1)
        middle = time.perf_counter()
        fresh.fill_(value + 2)
        end = time.perf_counter()
        first, touched = min(first, middle - start), min(touched, end - middle)
        del fresh
    return first, touched


def _copy_gbps(torch: Any, nbytes: int) -> float:
    """GB/s (read and written) of ``dst.copy_(src)`` between two touched host tensors of ``nbytes``."""
    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.zeros(nbytes, dtype=torch.uint8)
    dst.copy_(src)  # both touched

    def copy() -> None:
        dst.copy_(src)

    return 2 * nbytes / _best(copy, REPEATS) / 1e9


def _pageable_copy(torch: Any, nbytes: int) -> float:
    """GB/s of a host-to-device copy from pageable memory (CUDA only)."""
    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst.copy_(src)  # the driver's staging buffers are set up
    torch.cuda.synchronize()

    def copy() -> None:
        dst.copy_(src)
        torch.cuda.synchronize()

    return nbytes / _best(copy, REPEATS) / 1e9


def measure_host_rates(buffer_bytes: int = BUFFER_BYTES, touch_bytes: int = TOUCH_BYTES) -> HostRates:
    """Measure this host's rates (the module docstring); about a second on a 2-core host at the default sizes
    (torch's import aside)."""
    import torch

    start = time.perf_counter()
    why_not: dict[str, str] = {"host_s_per_kernel": LAUNCH_NEEDS_CUDA}
    memory = _copy_gbps(torch, buffer_bytes)
    first, touched = _first_touch(torch, touch_bytes)
    first_touch: float | None = None
    if first > touched:
        first_touch = touch_bytes / (first - touched) / 1e9
    else:
        why_not["host_first_touch_gbps"] = "a new tensor's first write was no slower than a touched one's here"
    pageable: float | None = None
    if torch.cuda.is_available():
        pageable = _pageable_copy(torch, buffer_bytes)
    else:
        why_not["pageable_copy_gbps"] = CUDA_NEEDED
    return HostRates(
        host_memory_gbps=memory,
        host_first_touch_gbps=first_touch,
        pageable_copy_gbps=pageable,
        threads=torch.get_num_threads(),
        buffer_bytes=buffer_bytes,
        seconds=time.perf_counter() - start,
        why_not=why_not,
    )
