"""The plan database: saved plans, measured probes and probe runs as frozen records, behind one
storage contract.

Open it with ``open_storage()`` (an explicit URL or path, then ``$PLANNER_DB``, then ``memplan.db`` in
the user data folder). Which URLs and paths it takes (``?mode=ro``, ``:memory:``, ``~``) and what it
refuses in one line are in ``store/db/_url.py``; SQLite's journal and sync settings in ``_engine.py``.
Opening a new or older database migrates it with the Alembic scripts in ``store/migrations``; opening
one already at the newest schema does not import Alembic. The store keeps its schema version in the
table ``memplan_alembic_version`` (``_schema.py``), so that Optuna's RDB storage, which keeps its own in
``alembic_version``, can hold ``planner tune``'s study in the same database: ``optuna_storage_url(db)``
gives Optuna the URL of the database that ``open_storage(db)`` opens.

PostgreSQL (a team database; ``pip install 'memplan[postgres]'`` installs psycopg 3):
``open_storage("postgresql+psycopg://user:password@host/dbname")``; plain ``postgresql://`` works too.
Every operation behaves as on SQLite; concurrent writers (several probe or tune processes) lose nothing.

Importing this package is cheap: SQLAlchemy (about half a second to import) loads on the first
``open_storage()`` or on first access to ``SQLAlchemyStorage``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from store.db._base import BaseStorage
from store.db._open import (
    connect_args,
    database_exists,
    default_db_url,
    holds_no_store,
    open_storage,
    optuna_storage_url,
    would_create,
)
from store.db._record import RUN_STATUSES, CalibrationRecord, PlanRecord, ProbeRecord, ProbeRunRecord

if TYPE_CHECKING:
    from store.db._sqlalchemy import SQLAlchemyStorage

__all__ = [
    "BaseStorage",
    "CalibrationRecord",
    "PlanRecord",
    "ProbeRecord",
    "ProbeRunRecord",
    "RUN_STATUSES",
    "SQLAlchemyStorage",
    "connect_args",
    "database_exists",
    "default_db_url",
    "holds_no_store",
    "open_storage",
    "optuna_storage_url",
    "would_create",
]


def __getattr__(name: str) -> object:
    """Load ``SQLAlchemyStorage`` (and SQLAlchemy) on first access."""
    if name == "SQLAlchemyStorage":
        from store.db._sqlalchemy import SQLAlchemyStorage

        return SQLAlchemyStorage
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
