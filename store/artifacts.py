"""What a probe keeps besides its measurements: named binary artifacts (its allocation records).

A probe stores at most one artifact per name:

- :data:`ALLOC_STREAM` (format :data:`store.alloc_stream.STREAM_FORMAT`): the allocation stream a CPU
  probe's tracker recorded, as :func:`store.alloc_stream.encode` wrote it;
- :data:`CUDA_SNAPSHOT` (format :data:`SNAPSHOT_FORMAT`): the CUDA caching allocator's
  ``torch.cuda.memory._snapshot()`` (its segments and its trace of allocations, frees, cudaMalloc and
  cudaFree), pickled and zlib-compressed, as :func:`pack_snapshot` writes it.

A snapshot is plain Python data (dicts, lists, str, int, float, bool, None); :func:`unpack_snapshot` reads
it with an unpickler that builds nothing else, so a stored blob cannot run code when it is opened.
"""

from __future__ import annotations

import io
import pickle
import re
import zlib
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ALLOC_STREAM",
    "ARTIFACT_NAME",
    "CUDA_SNAPSHOT",
    "SNAPSHOT_FORMAT",
    "ProbeArtifact",
    "pack_snapshot",
    "snapshot_pickle",
    "unpack_snapshot",
]

ALLOC_STREAM = "alloc-stream"
CUDA_SNAPSHOT = "cuda-snapshot"
SNAPSHOT_FORMAT = "pickle+zlib"
ARTIFACT_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")  # a name is also a file name in the probe folder


@dataclass(frozen=True)
class ProbeArtifact:
    """One named blob a probe kept: ``format`` says how to read ``data`` (see the module docstring)."""

    name: str
    format: str
    data: bytes

    def __repr__(self) -> str:
        return f"ProbeArtifact(name={self.name!r}, format={self.format!r}, {len(self.data)} bytes)"


def pack_snapshot(snapshot: dict[str, Any]) -> bytes:
    """A CUDA memory snapshot (or one built by :func:`store.cuda_snapshot.stream_to_snapshot`) as
    compressed pickle bytes (format :data:`SNAPSHOT_FORMAT`)."""
    return zlib.compress(pickle.dumps(snapshot, protocol=4), 6)


def snapshot_pickle(data: bytes) -> bytes:
    """The plain pickle inside :func:`pack_snapshot`'s bytes (what PyTorch's memory_viz opens)."""
    try:
        return zlib.decompress(data)
    except zlib.error as exc:
        raise ValueError(f"stored CUDA snapshot is corrupt: {exc}") from None


def unpack_snapshot(data: bytes) -> dict[str, Any]:
    """The snapshot dict :func:`pack_snapshot` packed; ValueError for anything else (including a pickle
    that asks for any class or function: a snapshot is plain data)."""
    try:
        value = _PlainUnpickler(io.BytesIO(snapshot_pickle(data))).load()
    except (pickle.UnpicklingError, EOFError, ValueError) as exc:
        raise ValueError(f"stored CUDA snapshot is not readable: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"stored CUDA snapshot is a {type(value).__name__}, not a dict")
    return value


class _PlainUnpickler(pickle.Unpickler):
    """Builds only pickle's own plain types; refuses every global (class or function)."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a snapshot holds plain data, not {module}.{name}")
