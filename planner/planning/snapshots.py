"""A stored probe's allocation records: its allocation stream, and a memory snapshot PyTorch's viewer opens.

A CPU probe keeps the allocation stream its tracker recorded; a CUDA probe keeps the caching allocator's
own snapshot (:mod:`store.artifacts`). :func:`probe_snapshot` returns the CUDA snapshot, or for a CPU
probe one built from its stream (:func:`store.cuda_snapshot.stream_to_snapshot`), ready to pickle for
https://pytorch.org/memory_viz; :func:`probe_stream` returns the stream (for a CUDA probe, read from its
snapshot by :func:`store.cuda_snapshot.snapshot_to_stream`). No torch here.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planner.files.atomic import write_bytes_atomic
from store.alloc_stream import decode
from store.artifacts import ALLOC_STREAM, CUDA_SNAPSHOT, unpack_snapshot
from store.cuda_snapshot import snapshot_to_stream, stream_to_snapshot
from store.db import open_storage, would_create
from store.errors import InputError

if TYPE_CHECKING:
    from store.alloc_stream import AllocStream
    from store.db import BaseStorage

MEMORY_VIZ_URL = "https://pytorch.org/memory_viz"


@dataclass(frozen=True)
class SnapshotFile:
    """What :func:`write_probe_snapshot` wrote: the file, the probe, where the snapshot came from
    (``"cuda"``: the allocator's own; ``"stream"``: built from a CPU probe's stream) and its trace length."""

    path: Path
    probe_id: str
    source: str
    entries: int

    def describe(self) -> str:
        """One line for the user: what was written and where to open it."""
        what = (
            "the CUDA allocator snapshot"
            if self.source == "cuda"
            else "a memory snapshot built from the CPU allocation stream"
        )
        count = f"{self.entries} trace entries"
        return f"wrote {self.path}: {what} of probe {self.probe_id} ({count}); open it at {MEMORY_VIZ_URL}"


def probe_stream(probe_id: str, db: str | None = None) -> AllocStream | None:
    """The allocation stream of a stored probe (id or unique prefix), or None when it kept none.

    A CPU probe's is the stream its tracker recorded; a CUDA probe's is read from its allocator snapshot.
    InputError (one line) for an unknown or ambiguous id.
    """

    _no_database(probe_id, db)
    with open_storage(db) as storage:
        return _stream(storage, probe_id)


def probe_snapshot(probe_id: str, db: str | None = None) -> dict[str, Any]:
    """A memory snapshot of a stored probe (id or unique prefix) for PyTorch's memory viewer: the CUDA
    allocator's own, or one built from a CPU probe's allocation stream. InputError (one line) for an
    unknown id or a probe that kept neither."""
    return _snapshot(probe_id, db)[1]


def write_probe_snapshot(
    probe_id: str, output: str | Path | None = None, *, force: bool = False, db: str | None = None
) -> SnapshotFile:
    """Write :func:`probe_snapshot` as a pickle (atomically) to ``output`` (default
    ``snapshot-<probe id>.pickle``); refuses to overwrite a file unless ``force``."""

    full_id, snapshot, source = _snapshot(probe_id, db)
    path = Path(output) if output is not None else Path(f"snapshot-{full_id}.pickle")
    written = write_bytes_atomic(path, pickle.dumps(snapshot, protocol=4), force=force)
    entries = sum(len(trace) for trace in snapshot.get("device_traces", []))
    return SnapshotFile(written, full_id, source, entries)


def _snapshot(probe_id: str, db: str | None) -> tuple[str, dict[str, Any], str]:
    """(the probe's full id, its snapshot, ``"cuda"`` or ``"stream"``)."""

    _no_database(probe_id, db)
    with open_storage(db) as storage:
        record = storage.get_probe(probe_id)
        cuda = storage.load_probe_artifact(record.probe_id, CUDA_SNAPSHOT)
        stream = None if cuda is not None else storage.load_probe_artifact(record.probe_id, ALLOC_STREAM)
    try:
        if cuda is not None:
            return record.probe_id, unpack_snapshot(cuda.data), "cuda"
        if stream is not None:
            return record.probe_id, stream_to_snapshot(decode(stream.data)), "stream"
    except ValueError as exc:
        raise InputError(f"probe {record.probe_id}: {exc}") from None
    raise InputError(_nothing_kept(record.probe_id, record.device))


def _stream(storage: BaseStorage, probe_id: str) -> AllocStream | None:
    record = storage.get_probe(probe_id)
    try:
        stream = storage.load_probe_artifact(record.probe_id, ALLOC_STREAM)
        if stream is not None:
            return decode(stream.data)
        cuda = storage.load_probe_artifact(record.probe_id, CUDA_SNAPSHOT)
        return snapshot_to_stream(unpack_snapshot(cuda.data)) if cuda is not None else None
    except ValueError as exc:
        raise InputError(f"probe {record.probe_id}: {exc}") from None


def _no_database(probe_id: str, db: str | None) -> None:
    """InputError when ``db`` names a database that does not exist yet (it is not created to be read)."""

    if would_create(db):
        shown = " ".join(str(probe_id).split())[:40]
        where = "the default database" if db is None else f"database {' '.join(str(db).split())[:80]}"
        raise InputError(f"no saved probe has the id {shown!r}: {where} does not exist yet")


def _nothing_kept(probe_id: str, device: str) -> str:
    kept = "an allocation stream" if device == "cpu" else "a CUDA allocator snapshot"
    return (
        f"probe {probe_id} has no stored allocation records (no {kept}): it ran before memplan kept them,"
        " or recording was off; run it again with `planner probe ... --force`"
    )
