"""The SQLAlchemy backend of the plan database (SQLite files by default, any SQLAlchemy URL works)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import URL, Engine, make_url, select
from sqlalchemy.exc import ArgumentError, DBAPIError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from store.db._base import BaseStorage
from store.db._engine import is_sqlite, make_engine, prepare_sqlite_file, sqlite_file
from store.db._orm import PlanRow
from store.db._record import MIN_PREFIX_LENGTH, PlanRecord, json_copy, new_plan_id
from store.db._schema import SchemaVersionError, ensure_schema
from store.errors import InputError

_JSON_FIELDS = ("workload", "hardware", "strategy", "predicted", "ds_config", "document")


class SQLAlchemyStorage(BaseStorage):
    """Plans in a SQLAlchemy database; opening it creates or upgrades the schema to the newest version.

    ``url`` is a SQLAlchemy URL such as ``sqlite:////abs/path/memplan.db``; the folder of a SQLite file
    is created when missing. A database that cannot be opened (unwritable place, not a database, a
    schema from a newer memplan, a missing driver) raises InputError with one line. The ``url``
    attribute is the URL opened, with any password hidden (for messages).
    """

    def __init__(self, url: str) -> None:
        """Open (creating or upgrading) the database at ``url``."""
        self._url = _parse_url(url)
        self.url = self._url.render_as_string(hide_password=True)
        try:
            path = sqlite_file(self._url) if is_sqlite(self._url) else None
            if path is not None:
                prepare_sqlite_file(path)
            self._engine: Engine = make_engine(self._url)
        except (OSError, ImportError, ArgumentError) as exc:
            raise InputError(f"cannot open database {self.url}: {_reason(exc)}") from exc
        try:
            ensure_schema(self._engine)
        except (SQLAlchemyError, SchemaVersionError) as exc:
            self._engine.dispose()
            raise InputError(f"cannot open database {self.url}: {_reason(exc)}") from exc
        self._sessions = sessionmaker(self._engine, expire_on_commit=False)

    @contextmanager
    def _session_scope(self) -> Iterator[Session]:
        """One unit of work: commit when the block ends, roll back everything when it raises.

        Operational failures of the database (locked, read-only, gone) become InputError.
        """
        session = self._sessions()
        try:
            yield session
            session.commit()
        except OperationalError as exc:
            session.rollback()
            raise InputError(f"cannot use database {self.url}: {_reason(exc)}") from exc
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
        with self._session_scope() as session:
            session.add(row)
            session.flush()
            session.refresh(row)  # what the database kept (its time precision), not what we sent
            return _to_record(row)

    def get_plan(self, plan_id_or_prefix: str) -> PlanRecord:
        """The plan with this id or unique id prefix (see ``BaseStorage``)."""
        wanted = plan_id_or_prefix.strip().lower()
        if len(wanted) < MIN_PREFIX_LENGTH:
            raise InputError(
                f"plan id {plan_id_or_prefix!r} is too short: give at least {MIN_PREFIX_LENGTH} characters"
            )
        stmt = (
            select(PlanRow)
            .where(PlanRow.plan_id.startswith(wanted, autoescape=True))
            .order_by(PlanRow.plan_id)
            .limit(3)
        )
        with self._session_scope() as session:
            rows = list(session.scalars(stmt))
            exact = [row for row in rows if row.plan_id == wanted]
            if exact or len(rows) == 1:
                return _to_record((exact or rows)[0])
        if not rows:
            raise InputError(f"no saved plan has an id starting with {wanted!r}; `planner plans` lists them")
        shown = ", ".join(row.plan_id for row in rows[:2]) + (" and more" if len(rows) > 2 else "")
        raise InputError(f"plan id {wanted!r} is ambiguous: it matches {shown}; give more characters")

    def latest_plan(self) -> PlanRecord | None:
        """The newest plan, or None when none is saved."""
        plans = self.list_plans(limit=1)
        return plans[0] if plans else None

    def list_plans(self, limit: int = 20, kind: str | None = None) -> list[PlanRecord]:
        """Up to ``limit`` plans, newest first, optionally only those of workload ``kind``."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InputError(f"the number of plans to list must be a whole number >= 1, got {limit!r}")
        stmt = select(PlanRow).order_by(PlanRow.created_at.desc(), PlanRow.id.desc()).limit(limit)
        if kind is not None:
            stmt = stmt.where(PlanRow.kind == kind)
        with self._session_scope() as session:
            return [_to_record(row) for row in session.scalars(stmt)]

    def close(self) -> None:
        """Release the connections; the storage must not be used afterwards."""
        self._engine.dispose()

    def __repr__(self) -> str:
        """Name the backend and its URL (password hidden)."""
        return f"SQLAlchemyStorage({self.url!r})"


def _parse_url(url: str) -> URL:
    """Parse a SQLAlchemy URL, or raise InputError."""
    try:
        return make_url(url)
    except ArgumentError as exc:
        raise InputError(f"cannot open database {url}: not a database URL ({exc})") from exc


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
    """A frozen record holding deep copies of the row's values."""
    return PlanRecord(
        plan_id=row.plan_id,
        created_at=row.created_at,
        kind=row.kind,
        model=row.model,
        fits=row.fits,
        **{name: copy.deepcopy(getattr(row, name)) for name in _JSON_FIELDS},
    )
