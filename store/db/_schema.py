"""Schema versions: a cheap check on every open, Alembic only when the database is behind.

Importing Alembic costs over half a second, so ``ensure_schema`` first reads ``alembic_version`` with
plain SQLAlchemy and compares it with ``HEAD_REVISION``; only a new or older database imports
Alembic and runs ``upgrade head`` with the scripts in ``store/migrations``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine, inspect, text

from store.db._engine import SQLITE_BEGIN_OPTION

if TYPE_CHECKING:  # Alembic is imported only when a database needs upgrading
    from alembic.config import Config

# The newest revision in store/migrations/versions; a test checks it against Alembic's head.
HEAD_REVISION = "0005"
MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"
VERSION_TABLE = "alembic_version"


class SchemaVersionError(Exception):
    """The database's schema version is one this memplan does not know (made by a newer memplan)."""


def stored_revision(conn: Connection) -> str | None:
    """The revision the database is at, or None when it has no version table (or not one row)."""
    if not inspect(conn).has_table(VERSION_TABLE):
        return None
    rows = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()
    return rows[0] if len(rows) == 1 else None


def ensure_schema(engine: Engine, read_only: bool = False) -> None:
    """Bring the database to ``HEAD_REVISION``, creating it when empty; one transaction, all or nothing.

    Raises SchemaVersionError for a revision the scripts do not know, or for a database not at
    ``HEAD_REVISION`` when ``read_only`` (it cannot be upgraded), and SQLAlchemy errors as they come
    (not a database, no permission, a table in the way).
    """
    with engine.connect() as conn:
        current = stored_revision(conn)
        conn.rollback()
    if current == HEAD_REVISION:
        return
    if read_only:
        state = "has no memplan tables yet" if current is None else f"is at the older schema {current!r}"
        raise SchemaVersionError(f"it {state} and mode=ro cannot upgrade it; open it once without mode=ro")
    with engine.connect() as conn:
        conn.execution_options(**{SQLITE_BEGIN_OPTION: "BEGIN IMMEDIATE"})
        with conn.begin():
            current = stored_revision(conn)  # again, under the write lock: another process may have won
            if current != HEAD_REVISION:
                _upgrade(conn, current)


def alembic_config() -> Config:
    """An Alembic ``Config`` for ``store/migrations`` without an ini file (imports Alembic)."""
    from alembic.config import Config

    config = Config()
    # Config values go through configparser interpolation: a literal "%" must be doubled.
    config.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
    return config


def _upgrade(conn: Connection, current: str | None) -> None:
    """Run ``alembic upgrade head`` on ``conn``, inside its open transaction."""
    from alembic import command
    from alembic.script.revision import RevisionError
    from alembic.util import CommandError

    config = alembic_config()
    config.attributes["connection"] = conn
    try:
        command.upgrade(config, "head")
    except (CommandError, RevisionError) as exc:
        raise SchemaVersionError(
            f"its schema version {current!r} is unknown to this memplan (newest known: {HEAD_REVISION!r});"
            " it was probably written by a newer memplan"
        ) from exc
