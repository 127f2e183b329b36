"""What memplan measures of this host once and keeps: the probe estimate's CPU rates
(:mod:`planner.probing.cpu_rates`) and the calibration's host benchmark (:mod:`planner.calibration.fit`).

Both are properties of the host, and measuring them means importing torch and running a benchmark in the
planner's own process (seconds of CPU on a 2-core EPYC, in every ``planner probe|tune|calibrate``). They are kept
in the user's cache folder (``$XDG_CACHE_HOME/memplan/host_rates.json``, else ``~/.cache/memplan/``), one entry
per :func:`host_key`: what makes a measurement this host's (the CPU model, its logical CPUs and those this process
may use, the torch version, a CUDA device present or not, and the variables that set torch's threads and oneDNN's
instruction set, the kernel release). A key that changes (another CPU, a torch upgrade, ``OMP_NUM_THREADS=1``)
measures anew; an entry older than :data:`MAX_AGE` (or that does not say when it was measured) measures anew;
deleting the file measures anew; a file that cannot be read or written is measured past, never an error.

Two processes of this host may measure at once (two ``planner probe --device cpu`` started together): each writes
under an exclusive ``fcntl.flock`` of ``host_rates.json.lock`` beside the file, re-reading the file under the lock
and changing only its own section (:func:`update`), so neither loses what the other kept; the file itself is
replaced whole (a temporary file renamed over it), so a reader, who takes no lock, sees the old file or the new one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import platform
import tempfile
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = [
    "MAX_AGE",
    "RATE_VARIABLES",
    "cache_path",
    "expires_at",
    "fresh",
    "host_key",
    "keep",
    "kept",
    "kept_rate",
    "measured_at",
    "update",
]

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
# how long a kept measurement is used before it is measured again. The key sees the CPU model, its CPUs, torch,
# the kernel and the thread variables, but not what changes a host's rates under the same key: the firmware's power
# profile and microcode, the memory fitted (channels, DIMMs), a virtual machine moved to another host of the same
# CPU model. A week bounds how long such a change goes unseen, at the cost of one measurement (about a second of
# cpu_rates.measure, a few of probes.measure.host_rates) per host a week.
MAX_AGE = timedelta(days=7)
LOCK_SUFFIX = ".lock"  # the lock file beside the cache: host_rates.json.lock (kept; removing it would race)


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
        "kernel": platform.release(),
        "cuda_driver": os.path.exists("/dev/nvidiactl"),
        **{name: os.environ.get(name, "") for name in RATE_VARIABLES},
    }
    return json.dumps(parts, sort_keys=True)


def kept(section: str, now: datetime | None = None) -> dict[str, Any]:
    """This host's kept ``section`` (``cpu_rates``, ``host_benchmark``); {} when there is none or it is not
    :func:`fresh` at ``now`` (default: the clock's now)."""
    entry = _read(cache_path()).get(host_key())
    value = entry.get(section) if isinstance(entry, dict) else None
    return value if isinstance(value, dict) and fresh(value, now) else {}


def keep(section: str, value: dict[str, Any], now: datetime | None = None) -> None:
    """Keep ``value`` as this host's ``section``, measured at ``now`` (default: the clock's now)."""
    update(section, lambda _held: value, now)


def update(section: str, change: Callable[[dict[str, Any]], dict[str, Any]], now: datetime | None = None) -> None:
    """Keep ``change(held)`` as this host's ``section``, measured at ``now`` (default: the clock's now): ``held``
    is the section as the file holds it under the writers' lock ({} where it is not :func:`fresh`, without its
    ``measured_at``), so what another process kept meanwhile is seen; the other sections and hosts are kept as
    they are. Nothing when the cache folder cannot be written."""
    moment = datetime.now(UTC) if now is None else now
    path, key = cache_path(), host_key()
    with contextlib.suppress(OSError), _writers_lock(path):
        everything = _read(path)
        entry = everything.get(key)
        entry = dict(entry) if isinstance(entry, dict) else {}
        held = entry.get(section)
        held = held if isinstance(held, dict) and fresh(held, moment) else {}
        changed = change({k: v for k, v in held.items() if k != "measured_at"})
        entry[section] = {**changed, "measured_at": moment.isoformat(timespec="seconds")}
        _write(path, {**everything, key: entry})


def fresh(section: dict[str, Any], now: datetime | None = None) -> bool:
    """Whether a kept ``section`` was measured at most :data:`MAX_AGE` before ``now`` (default: the clock's
    now): False where it does not say when in UTC, or says a time after ``now`` (a clock set back)."""
    try:
        measured = datetime.fromisoformat(str(section.get("measured_at")))
    except ValueError:
        return False
    if measured.tzinfo is None:
        return False
    age = (datetime.now(UTC) if now is None else now) - measured
    return timedelta(0) <= age <= MAX_AGE


@contextlib.contextmanager
def _writers_lock(path: Path) -> Iterator[None]:
    """Held by one writer of ``path`` at a time: an exclusive ``flock`` of the lock file beside it (released when
    the file is closed, by the kernel too if the process dies); OSError where the folder cannot be written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + LOCK_SUFFIX), "a", encoding="utf-8") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        yield


def measured_at(section: dict[str, Any]) -> str:
    """When a kept section was measured (``unknown`` where it does not say)."""
    return str(section.get("measured_at") or "unknown")


def expires_at(section: dict[str, Any]) -> str:
    """When a kept section stops being used (:data:`MAX_AGE` after it was measured), as ISO UTC; ``unknown``
    where it does not say when it was measured."""
    try:
        measured = datetime.fromisoformat(str(section.get("measured_at")))
    except ValueError:
        return "unknown"
    return (measured + MAX_AGE).isoformat(timespec="seconds")


def _read(path: Path) -> dict[str, Any]:
    """Everything kept, by host key ({} when there is no file, or it cannot be read as one)."""
    try:
        everything = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return everything if isinstance(everything, dict) else {}


def _write(path: Path, everything: dict[str, Any]) -> None:
    """Keep ``everything`` at ``path``: a temporary file renamed over it (a reader sees the old file or the new
    one); OSError when the folder cannot be written."""
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
