"""Probe artifact rows, to and from frozen ``ProbeArtifact`` values; the checks a save makes before writing."""

from __future__ import annotations

from collections.abc import Iterable

from store.artifacts import ARTIFACT_NAME, ProbeArtifact
from store.db._orm import ProbeArtifactRow

FORMAT_MAX_LENGTH = 64


def check_artifact(artifact: object) -> ProbeArtifact:
    """``artifact`` when it is a ProbeArtifact with a plain name (``store.artifacts.ARTIFACT_NAME``), a
    non-empty format of at most ``FORMAT_MAX_LENGTH`` characters and bytes as data; else TypeError."""
    if not isinstance(artifact, ProbeArtifact):
        raise TypeError(f"probe artifact must be a ProbeArtifact, got {type(artifact).__name__}")
    if not isinstance(artifact.name, str) or not ARTIFACT_NAME.fullmatch(artifact.name):
        raise TypeError(
            f"probe artifact name must be lowercase letters, digits, '.', '_' or '-', got {artifact.name!r}"
        )
    if not isinstance(artifact.format, str) or not 0 < len(artifact.format) <= FORMAT_MAX_LENGTH:
        raise TypeError(
            f"probe artifact format must be a non-empty str of at most {FORMAT_MAX_LENGTH} characters,"
            f" got {artifact.format!r}"
        )
    if not isinstance(artifact.data, bytes | bytearray | memoryview):
        raise TypeError(f"probe artifact data must be bytes, got {type(artifact.data).__name__}")
    return artifact


def check_artifacts(artifacts: Iterable[object]) -> list[ProbeArtifact]:
    """The artifacts checked one by one; ValueError when two share a name (a probe keeps one per name)."""
    checked = [check_artifact(artifact) for artifact in artifacts]
    names = [artifact.name for artifact in checked]
    doubled = sorted({name for name in names if names.count(name) > 1})
    if doubled:
        raise ValueError(f"a probe keeps one artifact per name; given twice: {', '.join(doubled)}")
    return checked


def new_artifact_row(probe_id: str, artifact: ProbeArtifact) -> ProbeArtifactRow:
    """The row that keeps ``artifact`` with probe ``probe_id`` (checked already)."""
    data = bytes(artifact.data)
    return ProbeArtifactRow(probe_id=probe_id, name=artifact.name, format=artifact.format, size=len(data), data=data)


def artifact_value(row: ProbeArtifactRow) -> ProbeArtifact:
    """A frozen value of the row (its bytes are immutable, nothing is shared with the session)."""
    return ProbeArtifact(name=row.name, format=row.format, data=bytes(row.data))
