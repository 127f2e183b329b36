"""Probes, their artifacts and probe runs in the SQLAlchemy backend (:class:`store.db._sqlalchemy.SQLAlchemyStorage`
is one of these): each read and written in one session scope of the storage."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from store.artifacts import ProbeArtifact
from store.db._artifacts import artifact_value, check_artifact, check_artifacts, new_artifact_row
from store.db._base import BaseStorage
from store.db._lookup import by_prefix, check_limit
from store.db._orm import ProbeArtifactRow, ProbeRow, ProbeRunRow
from store.db._probes import check_keys, new_probe_row, new_run_row, probe_record, run_record
from store.db._record import (
    UNFINISHED_STATUSES,
    ProbeRecord,
    ProbeRunRecord,
)
from store.errors import InputError
from store.measurements import STORED_OUTCOMES, ProbeRequest, ProbeResult

_FINISHED_STATUSES = ("done", "interrupted")
_PROBE_WORDS = ("probe id", "no saved probe", "; `planner probes` lists them")
_RUN_WORDS = ("probe run id", "no probe run", "")
_T = TypeVar("_T")


class ProbeRows(BaseStorage):
    """The probe, artifact and run methods of a storage whose ``_session_scope`` and ``_replacing`` open a unit
    of work and retry a replacing save (:class:`store.db._sqlalchemy.SQLAlchemyStorage`)."""

    url: str

    def _session_scope(self, write: bool = False) -> AbstractContextManager[Session]:
        raise NotImplementedError

    def _replacing(self, save: Callable[[], _T]) -> _T:
        raise NotImplementedError

    def save_probe(
        self, request: ProbeRequest, result: ProbeResult, *, key: str, run_id: str | None = None
    ) -> ProbeRecord:
        """Store a new probe under ``key`` in one transaction, keeping older ones (see ``BaseStorage``)."""
        row = new_probe_row(request, result, key, run_id)
        artifacts = check_artifacts(result.artifacts)
        with self._session_scope(write=True) as session:
            if run_id is not None and _run_row(session, run_id) is None:
                raise InputError(f"no probe run has the id {run_id!r}; start one before saving probes to it")
            session.add(row)
            session.add_all(new_artifact_row(row.probe_id, artifact) for artifact in artifacts)
            session.flush()
            session.refresh(row)  # what the database kept (its time precision), not what we sent
            return probe_record(row)

    def find_probe(self, key: str) -> ProbeRecord | None:
        """The newest probe stored under ``key`` with a final outcome, or None."""
        stmt = (
            select(ProbeRow)
            .where(ProbeRow.key == key, ProbeRow.outcome.in_(STORED_OUTCOMES))
            .order_by(ProbeRow.created_at.desc(), ProbeRow.id.desc())
            .limit(1)
        )
        with self._session_scope() as session:
            row = session.scalars(stmt).first()
            return probe_record(row) if row is not None else None

    def list_probes(
        self, limit: int = 50, kind: str | None = None, model: str | None = None, device: str | None = None
    ) -> list[ProbeRecord]:
        """Up to ``limit`` probes, newest first, optionally only those of this kind, model and device."""
        check_limit(limit, "probes")
        stmt = select(ProbeRow).order_by(ProbeRow.created_at.desc(), ProbeRow.id.desc()).limit(limit)
        for column, wanted in ((ProbeRow.kind, kind), (ProbeRow.model, model), (ProbeRow.device, device)):
            if wanted is not None:
                stmt = stmt.where(column == wanted)
        with self._session_scope() as session:
            return [probe_record(row) for row in session.scalars(stmt)]

    def get_probe(self, probe_id_or_prefix: str) -> ProbeRecord:
        """The probe with this id or unique id prefix (see ``BaseStorage``)."""
        with self._session_scope() as session:
            row = by_prefix(session, ProbeRow, ProbeRow.probe_id, probe_id_or_prefix, _PROBE_WORDS)
            return probe_record(row)

    def save_probe_artifact(self, probe_id_or_prefix: str, artifact: ProbeArtifact) -> ProbeArtifact:
        """Store ``artifact`` with the probe, replacing one of the same name (see ``BaseStorage``)."""
        check_artifact(artifact)

        def replace() -> ProbeArtifact:
            with self._session_scope(write=True) as session:
                probe = by_prefix(session, ProbeRow, ProbeRow.probe_id, probe_id_or_prefix, _PROBE_WORDS)
                session.execute(
                    delete(ProbeArtifactRow).where(
                        ProbeArtifactRow.probe_id == probe.probe_id, ProbeArtifactRow.name == artifact.name
                    )
                )
                row = new_artifact_row(probe.probe_id, artifact)
                session.add(row)
                session.flush()
                return artifact_value(row)

        return self._replacing(replace)

    def load_probe_artifact(self, probe_id_or_prefix: str, name: str) -> ProbeArtifact | None:
        """The probe's artifact named ``name``, or None (see ``BaseStorage``)."""
        with self._session_scope() as session:
            probe = by_prefix(session, ProbeRow, ProbeRow.probe_id, probe_id_or_prefix, _PROBE_WORDS)
            row = _artifact_row(session, probe.probe_id, name)
            return artifact_value(row) if row is not None else None

    def list_probe_artifacts(self, probe_id_or_prefix: str) -> dict[str, int]:
        """``{name: size in bytes}`` of the probe's artifacts, by name (see ``BaseStorage``)."""
        with self._session_scope() as session:
            probe = by_prefix(session, ProbeRow, ProbeRow.probe_id, probe_id_or_prefix, _PROBE_WORDS)
            stmt = (
                select(ProbeArtifactRow.name, ProbeArtifactRow.size)
                .where(ProbeArtifactRow.probe_id == probe.probe_id)
                .order_by(ProbeArtifactRow.name)
            )
            return {name: int(size) for name, size in session.execute(stmt)}

    def start_run(self, request_keys: list[str], options: dict[str, Any]) -> ProbeRunRecord:
        """Store a new probe run, status ``"running"``, for these keys (in order) and options."""
        row = new_run_row(request_keys, options)
        with self._session_scope(write=True) as session:
            session.add(row)
            session.flush()
            session.refresh(row)
            return run_record(row, [])

    def finish_run(self, run_id: str, status: str = "done") -> ProbeRunRecord:
        """Mark the run ``"done"`` or ``"interrupted"`` and return its record (see ``BaseStorage``)."""
        if status not in _FINISHED_STATUSES:
            raise ValueError(f"a probe run finishes as one of {', '.join(_FINISHED_STATUSES)}, got {status!r}")
        with self._session_scope(write=True) as session:
            row = _run_row(session, run_id)
            if row is None:
                raise InputError(f"no probe run has the id {run_id!r}")
            row.status = status
            session.flush()
            return run_record(row, _stored_keys(session, row.run_id))

    def unfinished_run(self, request_keys: list[str]) -> ProbeRunRecord | None:
        """The newest running or interrupted run asked for exactly these keys (in order), or None."""
        wanted = check_keys(request_keys)
        stmt = (
            select(ProbeRunRow)
            .where(ProbeRunRow.status.in_(UNFINISHED_STATUSES), ProbeRunRow.total == len(wanted))
            .order_by(ProbeRunRow.created_at.desc(), ProbeRunRow.id.desc())
        )
        with self._session_scope() as session:
            for row in session.scalars(stmt):  # few runs stay unfinished: compare the key lists here
                if list(row.request_keys) == wanted:
                    return run_record(row, _stored_keys(session, row.run_id))
        return None

    def get_run(self, run_id_or_prefix: str) -> ProbeRunRecord:
        """The run with this id or unique id prefix (see ``BaseStorage``)."""
        with self._session_scope() as session:
            row = by_prefix(session, ProbeRunRow, ProbeRunRow.run_id, run_id_or_prefix, _RUN_WORDS)
            return run_record(row, _stored_keys(session, row.run_id))


def _run_row(session: Session, run_id: str) -> ProbeRunRow | None:
    """The run row with exactly this id, or None."""
    return session.scalars(select(ProbeRunRow).where(ProbeRunRow.run_id == run_id)).first()


def _artifact_row(session: Session, probe_id: str, name: str) -> ProbeArtifactRow | None:
    """The artifact row of this probe and name, or None."""
    stmt = select(ProbeArtifactRow).where(ProbeArtifactRow.probe_id == probe_id, ProbeArtifactRow.name == name)
    return session.scalars(stmt).first()


def _stored_keys(session: Session, run_id: str) -> list[str]:
    """The keys of the probes stored with ``run_id``, in the order they were stored."""
    stmt = select(ProbeRow.key).where(ProbeRow.run_id == run_id).order_by(ProbeRow.id)
    return list(session.scalars(stmt))
