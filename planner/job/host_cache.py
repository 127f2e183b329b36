"""What memplan measures of this host once and keeps: the probe estimate's CPU rates
(:mod:`planner.probing.cpu_rates`) and the calibration's host benchmark (:mod:`planner.calibration.fit`).

Both are properties of the host, and measuring them means importing torch and running a benchmark in the
planner's own process (seconds of CPU on a 2-core EPYC, in every ``planner probe|tune|calibrate``). They are kept
in the user's cache folder (``$XDG_CACHE_HOME/memplan/host_rates.json``, else ``~/.cache/memplan/``), one entry
per :func:`host_key`: what makes a measurement this host's (the CPU model, its logical CPUs and those this process
may use, the torch version, a CUDA device present or not, and the variables that set torch's threads and oneDNN's
instruction set). A key that changes (another CPU, a torch upgrade, ``OMP_NUM_THREADS=1``) measures anew;
deleting the file measures anew; a file that cannot be read or written is measured past, never an error.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["RATE_VARIABLES", "cache_path", "host_key", "keep", "kept", "kept_rate", "measured_at"]

# what torch's thread count, oneDNN's kernels and the CUDA devices are read from (each changes the rates)
RATE_VARIABLES = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "ONEDNN_MAX_CPU_ISA",
    "DNNL_MAX_CPU_ISA",
    "CUDA_VISIBLE_DEVICES",
)
CACHE_FILE = "host_rates.json"
# raised whenever what a host entry holds, or how it is measured (planner.probing.cpu_rates.measure,
# probes.measure.host_rates), changes: entries of another format are measured again
KEY_FORMAT = 1


def cache_path(env: dict[str, str] | None = None) -> Path:
    """Where the measurements are kept: ``$XDG_CACHE_HOME/memplan/host_rates.json``, else ``~/.cache/memplan/``."""
    env = dict(os.environ) if env is None else env
    cache = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "memplan" / CACHE_FILE


def host_key() -> str:
    """What makes a measurement this host's, as one string (no torch import: the version is the package's)."""
    from probes.measure.fingerprint import cpu_name  # lazy on purpose: probes is imported only when measuring

    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = ""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0
    parts = {
        "format": KEY_FORMAT,  # what is measured and how: a new one measures again, never reads an older entry
        "cpu": cpu_name(),
        "logical_cpus": os.cpu_count() or 0,
        "usable_cpus": usable,
        "torch": torch_version,
        "cuda_driver": os.path.exists("/dev/nvidiactl"),
        **{name: os.environ.get(name, "") for name in RATE_VARIABLES},
    }
    return json.dumps(parts, sort_keys=True)


def kept(section: str) -> dict[str, Any]:
    """This host's kept ``section`` (``cpu_rates``, ``host_benchmark``); {} when there is none."""
    entry = _read(cache_path()).get(host_key())
    value = entry.get(section) if isinstance(entry, dict) else None
    return value if isinstance(value, dict) else {}


def keep(section: str, value: dict[str, Any]) -> None:
    """Keep ``value`` as this host's ``section``, with the time it was measured (``measured_at``)."""
    path, key = cache_path(), host_key()
    everything = _read(path)
    entry = everything.get(key)
    entry = dict(entry) if isinstance(entry, dict) else {}
    entry[section] = {**value, "measured_at": datetime.now(UTC).isoformat(timespec="seconds")}
    _write(path, {**everything, key: entry})


def measured_at(section: dict[str, Any]) -> str:
    """When a kept section was measured (``unknown`` where it does not say)."""
    return str(section.get("measured_at") or "unknown")


def _read(path: Path) -> dict[str, Any]:
    """Everything kept, by host key ({} when there is no file, or it cannot be read as one)."""
    try:
        everything = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return everything if isinstance(everything, dict) else {}


def _write(path: Path, everything: dict[str, Any]) -> None:
    """Keep ``everything`` at ``path``: a temporary file renamed over it (a reader sees the old file or the new
    one); nothing when the folder cannot be written."""
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                json.dump(everything, out, indent=1, sort_keys=True)
            os.replace(temporary, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)


def kept_rate(value: Any) -> float | None:
    """``value`` read from a kept entry as a rate: a finite positive number, else None (measure again)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
        return float(value)
    return None
