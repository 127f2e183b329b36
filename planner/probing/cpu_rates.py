"""This CPU's rates for the probe estimate (:mod:`planner.probing.estimate`), measured once per host and kept.

A CPU probe's estimate without a calibration of this CPU runs the GPU time model on the CPU's own rates: a matrix
product in the probe's dtype and in fp32, and a memory copy, measured with torch's threads (:func:`measure`, a
fraction of a second). Measuring meant importing torch in the planner's own process, about 3 CPU s on a 2-core
EPYC, paid by every ``planner probe|tune --device cpu`` although the probes themselves run in children. The rates
are a property of the host, so they are kept in the user's cache folder
(``$XDG_CACHE_HOME/memplan/cpu_rates.json``, else ``~/.cache/memplan/``), keyed by what makes them this host's
(:func:`host_key`: the CPU model, its logical CPUs and those this process may use, the torch version, and the
variables that set torch's threads and oneDNN's instruction set); a later run on the same host reads them
without importing torch. A key that changes (another CPU, a torch upgrade, ``OMP_NUM_THREADS=1``) measures anew.
Deleting the file measures anew; a cache that cannot be read or written is measured past, never an error.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import time
from datetime import UTC, datetime
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["FAST_DTYPE_GAIN", "RATE_VARIABLES", "cache_path", "cpu_rates", "host_key", "measure"]

FAST_DTYPE_GAIN = 2.0  # a 16-bit dtype's step runs at most this much faster than fp32's on a CPU
# what torch's thread count and oneDNN's kernels are read from as torch loads (each changes the rates)
RATE_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")
CACHE_FILE = "cpu_rates.json"


def cache_path(env: dict[str, str] | None = None) -> Path:
    """Where the rates are kept: ``$XDG_CACHE_HOME/memplan/cpu_rates.json``, else ``~/.cache/memplan/``."""
    env = dict(os.environ) if env is None else env
    cache = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "memplan" / CACHE_FILE


def host_key() -> str:
    """What makes measured rates this host's, as one string (no torch import: the version is the package's)."""
    from probes.measure.fingerprint import cpu_name  # lazy on purpose: probes is imported only when probing

    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = ""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0
    parts = {
        "cpu": cpu_name(),
        "logical_cpus": os.cpu_count() or 0,
        "usable_cpus": usable,
        "torch": torch_version,
        **{name: os.environ.get(name, "") for name in RATE_VARIABLES},
    }
    return json.dumps(parts, sort_keys=True)


def cpu_rates(dtype: str) -> tuple[float, float]:
    """(matrix-product FLOP/s of a ``dtype`` step, memory copy bytes/s) this CPU reaches with torch's threads: the
    dtype's rate, at most ``FAST_DTYPE_GAIN`` times fp32's; from the cache when this host measured them before,
    else measured now (:func:`measure`) and kept."""
    return _cached_rates(host_key(), dtype)


@lru_cache(maxsize=8)
def _cached_rates(key: str, dtype: str) -> tuple[float, float]:
    path = cache_path()
    kept = _read(path)
    entry = kept.get(key)
    entry = entry if isinstance(entry, dict) else {}
    matmuls = entry.get("matmul_flops_per_s")
    matmuls = matmuls if isinstance(matmuls, dict) else {}
    kept_matmul, kept_copy = _rate(matmuls.get(dtype)), _rate(entry.get("copy_bytes_per_s"))
    if kept_matmul is not None and kept_copy is not None:
        return kept_matmul, kept_copy
    matmul, copy = measure(dtype)
    entry = {
        "matmul_flops_per_s": {**matmuls, dtype: matmul},
        "copy_bytes_per_s": copy,
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    _write(path, {**kept, key: entry})
    return matmul, copy


def _rate(value: Any) -> float | None:
    """``value`` as a kept rate: a finite positive number (None when it is none)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
        return float(value)
    return None


def _read(path: Path) -> dict[str, Any]:
    """The kept rates by host key ({} when there is no file, or it cannot be read as one)."""
    try:
        kept = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return kept if isinstance(kept, dict) else {}


def _write(path: Path, kept: dict[str, Any]) -> None:
    """Keep ``kept`` at ``path``: a temporary file renamed over it (a reader sees the old file or the new one);
    nothing when the folder cannot be written."""
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                json.dump(kept, out, indent=1, sort_keys=True)
            os.replace(temporary, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)


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
