"""A probe's allocation records: what the child records, how it hands them over, how the parent reads them.

- CPU probes: the live-tensor tracker records the allocation stream (:mod:`store.alloc_stream`), on by
  default; ``MEMPLAN_RECORD_STREAM=0`` in the environment turns it off. Its cost is a tuple appended per
  counted allocation and free plus one walk of the GC's objects for the kinds: +1 to +4 % of a tiny probe's
  wall time, the measured step within noise (``benchmarks/stream_overhead.py``).
- CUDA probes: the caching allocator's own history, ``torch.cuda.memory._record_memory_history`` from
  before the build (every allocation, free and segment event, at most :data:`CUDA_HISTORY_MAX_ENTRIES`
  entries; without stacks, which cost host time on every allocation of a timed phase, unless
  ``MEMPLAN_CUDA_HISTORY=stacks``), and ``torch.cuda.memory._snapshot()`` at the end;
  ``MEMPLAN_CUDA_HISTORY=0`` turns it off.

The child writes each record to ``DIR/artifact.<name>`` and lists it in ``extra["artifacts"]`` (name:
format and size), whatever the outcome (an out-of-memory probe's records are the interesting ones); the
parent reads the listed files before the folder goes (:func:`read_artifacts`). Torch is imported only
inside the CUDA functions, which run in the child.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from store.alloc_stream import STREAM_FORMAT, encode
from store.artifacts import ALLOC_STREAM, ARTIFACT_NAME, CUDA_SNAPSHOT, SNAPSHOT_FORMAT, ProbeArtifact, pack_snapshot

__all__ = [
    "CUDA_HISTORY_ENV",
    "CUDA_HISTORY_MAX_ENTRIES",
    "RECORD_STREAM_ENV",
    "Recording",
    "cpu_stream_enabled",
    "read_artifacts",
    "start_cuda_history",
]

RECORD_STREAM_ENV = "MEMPLAN_RECORD_STREAM"
CUDA_HISTORY_ENV = "MEMPLAN_CUDA_HISTORY"
CUDA_HISTORY_MAX_ENTRIES = 1_000_000  # a ring buffer: a longer probe keeps its last entries only
ARTIFACT_PREFIX = "artifact."


def _enabled(variable: str) -> bool:
    return os.environ.get(variable, "1").strip().lower() not in ("0", "false", "no", "off")


def cpu_stream_enabled() -> bool:
    """Whether a CPU probe's tracker records its allocation stream (on unless ``MEMPLAN_RECORD_STREAM=0``)."""
    return _enabled(RECORD_STREAM_ENV)


def start_cuda_history() -> bool:
    """Start recording the CUDA caching allocator's history (unless ``MEMPLAN_CUDA_HISTORY=0``); returns
    whether it started."""
    if not _enabled(CUDA_HISTORY_ENV):
        return False
    import torch

    # Stack capture costs host time on every allocation, and a probe times its phases: only the events are
    # kept unless MEMPLAN_CUDA_HISTORY=stacks asks for Python stacks too (memory_viz then names the code).
    stacks = os.environ.get(CUDA_HISTORY_ENV, "").strip().lower() == "stacks"
    torch.cuda.memory._record_memory_history(
        enabled="all",
        context="alloc" if stacks else None,
        stacks="python",
        max_entries=CUDA_HISTORY_MAX_ENTRIES,
    )
    return True


@dataclass
class Recording:
    """What the child records: the CPU tracker (when it keeps a stream) or the CUDA history (``cuda``)."""

    tracker: Any = None
    cuda: bool = False
    stream_events: int = 0  # events of the CPU stream collected last

    def collect(self) -> list[ProbeArtifact]:
        """The records as artifacts (the CUDA snapshot is taken now, and the history stopped)."""
        found: list[ProbeArtifact] = []
        if self.tracker is not None and getattr(self.tracker, "record_stream", False):
            stream = self.tracker.stream()
            self.stream_events = len(stream)
            found.append(ProbeArtifact(ALLOC_STREAM, STREAM_FORMAT, encode(stream)))
        if self.cuda:
            import torch

            snapshot = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
            found.append(ProbeArtifact(CUDA_SNAPSHOT, SNAPSHOT_FORMAT, pack_snapshot(snapshot)))
        return found

    def write(self, folder: Path, extra: dict[str, Any]) -> None:
        """Write each record to ``folder/artifact.<name>`` and list it in ``extra["artifacts"]``; a failure
        is noted in ``extra["artifact_error"]`` and never changes the probe's outcome."""
        listed: dict[str, Any] = {}
        try:
            for artifact in self.collect():
                (folder / (ARTIFACT_PREFIX + artifact.name)).write_bytes(artifact.data)
                listed[artifact.name] = {"format": artifact.format, "bytes": len(artifact.data)}
                if artifact.name == ALLOC_STREAM:
                    listed[artifact.name]["events"] = self.stream_events
        except Exception as exc:  # noqa: BLE001 - the records are extra; the measurement stands without them
            extra["artifact_error"] = f"{type(exc).__name__}: {exc}"[:500]
        if listed:
            extra["artifacts"] = listed


def read_artifacts(folder: Path, result: dict[str, Any] | None) -> tuple[ProbeArtifact, ...]:
    """The artifacts the child listed in its result's ``extra["artifacts"]`` and wrote into ``folder``
    (a listed file that is missing or a name that is not a plain file name is skipped)."""
    extra = result.get("extra") if isinstance(result, dict) else None
    listed = extra.get("artifacts") if isinstance(extra, dict) else None
    if not isinstance(listed, dict):
        return ()
    found = []
    for name, info in listed.items():
        if not isinstance(name, str) or not ARTIFACT_NAME.fullmatch(name) or not isinstance(info, dict):
            continue
        try:
            data = (folder / (ARTIFACT_PREFIX + name)).read_bytes()
        except OSError:
            continue
        found.append(ProbeArtifact(name, str(info.get("format", "")), data))
    return tuple(found)
