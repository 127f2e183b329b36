"""This CPU's rates for the probe estimate (:mod:`planner.probing.estimate`), measured once per host and kept.

A CPU probe's estimate without a calibration of this CPU runs the GPU time model on the CPU's own rates: a matrix
product in the probe's dtype and in fp32, and a memory copy, measured with torch's threads (:func:`measure`, a
fraction of a second). Measuring meant importing torch in the planner's own process, about 3 CPU s on a 2-core
EPYC, paid by every ``planner probe|tune --device cpu`` although the probes themselves run in children. The rates
are a property of the host, so they are kept (:mod:`planner.job.host_cache`: the user's cache folder, one entry
per host key) and a later run on the same host reads them without importing torch.
"""

from __future__ import annotations

import math
import time
from functools import lru_cache
from typing import Any

from planner.job.host_cache import host_key, kept, kept_rate, update

__all__ = ["FAST_DTYPE_GAIN", "cpu_rates", "measure"]

FAST_DTYPE_GAIN = 2.0  # a 16-bit dtype's step runs at most this much faster than fp32's on a CPU
SECTION = "cpu_rates"


def cpu_rates(dtype: str) -> tuple[float, float]:
    """(matrix-product FLOP/s of a ``dtype`` step, memory copy bytes/s) this CPU reaches with torch's threads: the
    dtype's rate, at most ``FAST_DTYPE_GAIN`` times fp32's; from the cache when this host measured them before,
    else measured now (:func:`measure`) and kept."""
    return _cached_rates(host_key(), dtype)


@lru_cache(maxsize=8)
def _cached_rates(key: str, dtype: str) -> tuple[float, float]:
    """:func:`cpu_rates` of the host ``key`` (this one): kept by this process too, for a cache it cannot write."""
    entry = kept(SECTION)
    matmuls = entry.get("matmul_flops_per_s")
    matmuls = matmuls if isinstance(matmuls, dict) else {}
    kept_matmul, kept_copy = kept_rate(matmuls.get(dtype)), kept_rate(entry.get("copy_bytes_per_s"))
    if kept_matmul is not None and kept_copy is not None:
        return kept_matmul, kept_copy
    matmul, copy = measure(dtype)

    def beside(held: dict[str, Any]) -> dict[str, Any]:  # the dtypes kept meanwhile (another probe) kept too
        theirs = held.get("matmul_flops_per_s")
        return {
            "matmul_flops_per_s": {**(theirs if isinstance(theirs, dict) else {}), dtype: matmul},
            "copy_bytes_per_s": copy,
        }

    update(SECTION, beside)
    return matmul, copy


def measure(dtype: str) -> tuple[float, float]:
    """:func:`cpu_rates` measured now (imports torch): the dtype's matrix-product rate capped at
    ``FAST_DTYPE_GAIN`` times fp32's, and the memory copy rate."""
    rate = _matmul_rate(dtype)
    if dtype != "fp32":
        rate = min(rate, FAST_DTYPE_GAIN * _matmul_rate("fp32"))
    return rate, _copy_rate()


def _matmul_rate(dtype: str) -> float:
    """FLOP/s of a square matrix product in ``dtype``, measured now: the fastest of a few products of each size,
    the size growing from 128 to 1024 while one takes under 20 ms (a dtype torch computes with its reference
    kernel stays small). The fastest, not the mean: a product the scheduler interrupted says nothing of the CPU."""
    import torch  # lazy on purpose: measured only where this host's rates are not kept

    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    flops_per_s = 0.0
    size = 128
    while size <= 1024:
        a = torch.randn(size, size).to(torch_dtype)
        b = torch.randn(size, size).to(torch_dtype)
        torch.matmul(a, b)  # the first product pays for oneDNN's set-up
        fastest, spent = math.inf, 0.0
        for _ in range(5):
            start = time.perf_counter()
            torch.matmul(a, b)
            seconds = time.perf_counter() - start
            fastest, spent = min(fastest, seconds), spent + seconds
            if spent > 0.05:
                break
        flops_per_s = 2 * size**3 / fastest
        if fastest > 0.02:
            break
        size *= 2
    return flops_per_s


def _copy_rate() -> float:
    """Bytes/s of a 64 MiB memory copy (read and write), measured now: the fastest of a few."""
    import torch  # lazy on purpose: measured only where this host's rates are not kept

    source = torch.empty(16 * 2**20)  # 64 MiB of fp32
    target = torch.empty_like(source)
    target.copy_(source)
    fastest = math.inf
    for _ in range(4):
        start = time.perf_counter()
        target.copy_(source)
        fastest = min(fastest, time.perf_counter() - start)
    return 2 * source.numel() * 4 / fastest
