"""The SQLAlchemy backend of the plan database (SQLite files by default; PostgreSQL through psycopg 3;
any SQLAlchemy URL works): plans, probes (with their artifacts) and probe runs, each read and written in
one session scope.

Concurrent writers (several ``planner probe`` or ``planner tune`` processes on one database) lose
nothing: on SQLite every writing transaction starts with ``BEGIN IMMEDIATE``, so writers queue on the
write lock (waiting up to the busy timeout) instead of deadlocking when two of them read and then
write; on PostgreSQL rows are only added, and the two saves that replace a row by name (a probe
artifact, a model shape) try again when another writer inserted the same name first.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, delete, select
from sqlalchemy.exc import (
    ArgumentError,
    DatabaseError,
    DataError,
    DBAPIError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    SQLAlchemyError,
)
from sqlalchemy.orm import Session, sessionmaker

from store.db._calibrations import calibration_record, new_calibration_row
from store.db._engine import SQLITE_BEGIN_OPTION, make_engine, prepare_sqlite_file, remove_folders
from store.db._lookup import by_prefix, check_limit
from store.db._orm import Base, CalibrationRow, ModelShapeRow, PlanRow
from store.db._probe_rows import ProbeRows
from store.db._record import (
    CalibrationRecord,
    PlanRecord,
    json_copy,
    new_plan_id,
)
from store.db._schema import SchemaVersionError, ensure_schema
from store.db._url import resolve_db
from store.errors import InputError

_JSON_FIELDS = ("workload", "hardware", "strategy", "predicted", "ds_config", "document")
# How prefix lookups name what they look for: the id, "none of them", and where the ids are listed.
_PLAN_WORDS = ("plan id", "no saved plan", "; `planner plans` lists them")
_CALIBRATION_WORDS = ("calibration id", "no calibration", "; `planner calibrations` lists them")

# How often a save that replaces a row by name runs when concurrent writers keep inserting that name first.
REPLACE_ATTEMPTS = 5
# What to install for a driver SQLAlchemy could not import, by the URL's backend.
_DRIVER_HINTS = {"postgresql": "for PostgreSQL: pip install 'memplan[postgres]' (psycopg 3)"}

_Row = TypeVar("_Row", bound=Base)
_T = TypeVar("_T")


class SQLAlchemyStorage(ProbeRows):
    """Plans, probes and probe runs in a SQLAlchemy database; opening it creates or upgrades the schema
    to the newest version.

    ``url`` is a SQLAlchemy URL such as ``sqlite:////abs/path/memplan.db`` or a SQLite file path, checked
    by ``store.db._url.resolve_db`` (which URLs, paths and ``?mode=`` parameters are accepted); the
    folder of a SQLite file is created when missing. A database that cannot be opened (a bad URL or
    path, an unwritable place, not a database, a schema from a newer memplan, a missing driver)
    raises InputError with one line, and leaves no new file or folder behind. The ``url`` attribute
    names the database opened for messages: password hidden, a long one shortened.
    """

    def __init__(self, url: str) -> None:
        """Open (creating or upgrading) the database at ``url`` (checked by ``resolve_db``)."""
        target = resolve_db(url)
        self._url = target.url
        self.url = target.shown
        created: list[Path] = []
        existed = target.path is not None and target.path.exists()
        try:
            if target.path is not None:
                created = prepare_sqlite_file(target.path, target.mode)
            self._engine: Engine = make_engine(self._url, in_memory=target.memory)
        except ImportError as exc:
            hint = _DRIVER_HINTS.get(self._url.get_backend_name(), "install the driver this URL names")
            why = f"its driver is missing ({_reason(exc)}); {hint}"
            raise InputError(f"cannot open database {self.url}: {why}") from exc
        except (OSError, ArgumentError) as exc:
            raise InputError(f"cannot open database {self.url}: {self._reason(exc)}") from exc
        try:
            ensure_schema(self._engine, read_only=target.mode == "ro")
        except (SQLAlchemyError, SchemaVersionError) as exc:
            self._engine.dispose()
            if target.path is not None and not existed:  # nothing half-made stays behind
                _remove_if_empty(target.path)
                remove_folders(created)
            raise InputError(f"cannot open database {self.url}: {self._reason(exc)}") from exc
        self._sessions = sessionmaker(self._engine, expire_on_commit=False)

    @contextmanager
    def _session_scope(self, write: bool = False) -> Iterator[Session]:
        """One unit of work: commit when the block ends, roll back everything when it raises. A ``write``
        scope on SQLite takes the write lock at its start (``BEGIN IMMEDIATE``; see the module docstring).

        Failures of the database (locked, read-only, gone, damaged, a server out of reach) and values it
        refuses (PostgreSQL: text longer than its column, NUL characters) become InputError; nothing is
        written. In a reading scope, a stored row that cannot be decoded into its record (JSON or a time
        changed by hand) is an InputError too.
        """
        session = self._sessions()
        try:
            if write:
                session.connection(execution_options={SQLITE_BEGIN_OPTION: "BEGIN IMMEDIATE"})
            yield session
            session.commit()
        except (OperationalError, InterfaceError, DataError) as exc:
            session.rollback()
            raise InputError(f"cannot use database {self.url}: {self._reason(exc)}") from exc
        except IntegrityError:
            session.rollback()
            raise  # a concurrent writer inserted the same name first: ``_replacing`` tries again
        except DatabaseError as exc:  # SQLite: "database disk image is malformed" (a damaged page)
            session.rollback()
            raise InputError(f"cannot use database {self.url}: {self._reason(exc)}") from exc
        except InputError:
            session.rollback()
            raise
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            session.rollback()
            if write:
                raise  # a value the caller gave that cannot be stored: a programming error
            raise InputError(
                f"cannot read database {self.url}: a stored row is damaged ({self._reason(exc)}); "
                "it was changed by hand or by another program"
            ) from exc
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    def save_plan(
        self,
        *,
        kind: str,
        model: str,
        fits: bool,
        workload: dict[str, Any],
        hardware: dict[str, Any],
        strategy: dict[str, Any],
        predicted: dict[str, Any],
        ds_config: dict[str, Any],
        document: dict[str, Any],
    ) -> PlanRecord:
        """Store a new plan in one transaction and return its record (see ``BaseStorage``)."""
        for name, value in (("kind", kind), ("model", model)):
            if not isinstance(value, str) or not value:
                raise TypeError(f"plan field {name!r} must be a non-empty str, got {value!r}")
        if not isinstance(fits, bool):
            raise TypeError(f"plan field 'fits' must be a bool, got {fits!r}")
        given = dict(
            workload=workload,
            hardware=hardware,
            strategy=strategy,
            predicted=predicted,
            ds_config=ds_config,
            document=document,
        )
        payload = {name: json_copy(name, given[name]) for name in _JSON_FIELDS}
        plan_id = new_plan_id()
        payload["document"] = {"plan_id": plan_id} | {k: v for k, v in payload["document"].items() if k != "plan_id"}
        row = PlanRow(
            plan_id=plan_id,
            created_at=datetime.now(timezone.utc),
            kind=kind,
            model=model,
            fits=fits,
            **payload,
        )
        with self._session_scope(write=True) as session:
            session.add(row)
            session.flush()
            session.refresh(row)  # what the database kept (its time precision), not what we sent
            return _to_record(row)

    def get_plan(self, plan_id_or_prefix: str) -> PlanRecord:
        """The plan with this id or unique id prefix (see ``BaseStorage``)."""
        with self._session_scope() as session:
            row = by_prefix(session, PlanRow, PlanRow.plan_id, plan_id_or_prefix, _PLAN_WORDS)
            return _to_record(row)

    def latest_plan(self) -> PlanRecord | None:
        """The newest plan, or None when none is saved."""
        plans = self.list_plans(limit=1)
        return plans[0] if plans else None

    def list_plans(self, limit: int = 20, kind: str | None = None) -> list[PlanRecord]:
        """Up to ``limit`` plans, newest first, optionally only those of workload ``kind``."""
        check_limit(limit, "plans")
        stmt = select(PlanRow).order_by(PlanRow.created_at.desc(), PlanRow.id.desc()).limit(limit)
        if kind is not None:
            stmt = stmt.where(PlanRow.kind == kind)
        with self._session_scope() as session:
            return [_to_record(row) for row in session.scalars(stmt)]

    def save_model_shape(self, key: str, shape: dict[str, Any]) -> None:
        """Store a traced model shape under ``key``, replacing an older one (see ``BaseStorage``)."""
        if not isinstance(key, str) or not 0 < len(key) <= 64:
            raise TypeError(f"model shape key must be a str of 1 to 64 characters, got {key!r}")
        if not isinstance(shape, dict) or not isinstance(shape.get("model_type"), str):
            raise TypeError("model shape must be a dict with a str model_type")
        stored = json_copy("shape", shape, "model shape")
        model_type = shape["model_type"][:64]

        def replace() -> None:
            with self._session_scope(write=True) as session:
                session.execute(delete(ModelShapeRow).where(ModelShapeRow.key == key))
                created = datetime.now(timezone.utc)
                session.add(ModelShapeRow(key=key, model_type=model_type, created_at=created, shape=stored))

        self._replacing(replace)

    def load_model_shape(self, key: str) -> dict[str, Any] | None:
        """The model shape stored under ``key``, or None (see ``BaseStorage``)."""
        with self._session_scope() as session:
            row = session.execute(select(ModelShapeRow).where(ModelShapeRow.key == key)).scalar_one_or_none()
            return copy.deepcopy(row.shape) if row is not None else None

    def save_calibration(
        self,
        *,
        target: str,
        device: str,
        version: int,
        fingerprint: dict[str, Any],
        values: dict[str, float],
        probe_ids: list[str],
        report: dict[str, Any],
    ) -> CalibrationRecord:
        """Store a new calibration in one transaction and return its record (see ``BaseStorage``)."""
        row = new_calibration_row(
            target=target,
            device=device,
            version=version,
            fingerprint=fingerprint,
            values=values,
            probe_ids=probe_ids,
            report=report,
        )
        with self._session_scope(write=True) as session:
            session.add(row)
            session.flush()
            return calibration_record(row)

    def latest_calibration(self, target: str, version: int | None = None) -> CalibrationRecord | None:
        """The newest calibration of ``target`` (of ``version`` when given), or None."""
        with self._session_scope() as session:
            stmt = select(CalibrationRow).where(CalibrationRow.target == target)
            if version is not None:
                stmt = stmt.where(CalibrationRow.version == version)
            row = session.scalars(stmt.order_by(CalibrationRow.created_at.desc(), CalibrationRow.id.desc())).first()
            return calibration_record(row) if row is not None else None

    def list_calibrations(self, limit: int = 20, target: str | None = None) -> list[CalibrationRecord]:
        """Up to ``limit`` calibrations, newest first, optionally only those of ``target``."""
        check_limit(limit, "calibrations")
        with self._session_scope() as session:
            stmt = select(CalibrationRow)
            if target is not None:
                stmt = stmt.where(CalibrationRow.target == target)
            stmt = stmt.order_by(CalibrationRow.created_at.desc(), CalibrationRow.id.desc()).limit(limit)
            return [calibration_record(row) for row in session.scalars(stmt)]

    def get_calibration(self, calibration_id_or_prefix: str) -> CalibrationRecord:
        """The calibration with this id or unique id prefix (see ``BaseStorage``)."""
        with self._session_scope() as session:
            row = by_prefix(
                session, CalibrationRow, CalibrationRow.calibration_id, calibration_id_or_prefix, _CALIBRATION_WORDS
            )
            return calibration_record(row)

    def close(self) -> None:
        """Release the connections; the storage must not be used afterwards."""
        self._engine.dispose()

    def _replacing(self, save: Callable[[], _T]) -> _T:
        """Run ``save`` (one transaction that deletes a row by its unique name and inserts its successor)
        again when a concurrent writer inserted that name in between (PostgreSQL's unique index refuses
        the second insert; SQLite's write lock never lets the two overlap). InputError when writers keep
        colliding ``REPLACE_ATTEMPTS`` times."""
        for _ in range(REPLACE_ATTEMPTS - 1):
            try:
                return save()
            except IntegrityError:
                continue
        try:
            return save()
        except IntegrityError as exc:
            raise InputError(f"cannot use database {self.url}: {self._reason(exc)}") from exc

    def _reason(self, exc: BaseException) -> str:
        """``_reason(exc)`` with this database's password, should the driver's message hold it, hidden."""
        text = _reason(exc)
        password = self._url.password
        return text.replace(str(password), "***") if password else text

    def __repr__(self) -> str:
        """Name the backend and its URL (password hidden)."""
        return f"SQLAlchemyStorage({self.url!r})"


def _remove_if_empty(path: Path) -> None:
    """Remove ``path`` when it is an empty file (what a failed first open of a SQLite file leaves)."""
    try:
        if path.stat().st_size == 0:
            path.unlink()
    except OSError:
        pass


def _reason(exc: BaseException) -> str:
    """The short, one-line cause of a failure (the driver's message, without SQLAlchemy's wrapping)."""
    if isinstance(exc, DBAPIError) and exc.orig is not None:
        exc = exc.orig
    if isinstance(exc, OSError) and exc.strerror and exc.filename is not None:
        text = f"{exc.strerror}: {exc.filename}"
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())


def _to_record(row: PlanRow) -> PlanRecord:
    """A frozen record holding deep copies of the row's values; ValueError for a row whose JSON is not an
    object where the record has one (a row changed by hand)."""
    for name in _JSON_FIELDS:
        if not isinstance(getattr(row, name), dict):
            raise ValueError(f"plan {row.plan_id}: its {name} is not a JSON object")
    return PlanRecord(
        plan_id=row.plan_id,
        created_at=row.created_at,
        kind=row.kind,
        model=row.model,
        fits=row.fits,
        **{name: copy.deepcopy(getattr(row, name)) for name in _JSON_FIELDS},
    )
