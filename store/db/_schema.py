"""Schema versions: a cheap check on every open, Alembic only when the database is behind.

Importing Alembic costs over half a second, so ``ensure_schema`` first reads the store's version table
with plain SQLAlchemy and compares it with ``HEAD_REVISION``; only a new or older database imports
Alembic and runs ``upgrade head`` with the scripts in ``store/migrations``.

The version table is ``memplan_alembic_version`` (``VERSION_TABLE``), not Alembic's default
``alembic_version``: Optuna's RDB storage keeps its own Alembic revision in ``alembic_version``, and a
``planner tune`` study lives in the same database as the plans and probes. Databases written before the
rename keep the store's revision (``LEGACY_REVISIONS``) in ``alembic_version``; the first writable open
moves it to ``memplan_alembic_version`` and drops the old table, in the same transaction as any upgrade
(all or nothing). A read-only open of such a database works when its tables are at ``HEAD_REVISION``;
when they are older it says that it must be opened once without ``mode=ro``. An ``alembic_version``
holding any other revision belongs to someone else (Optuna) and is left alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Column, Connection, Engine, MetaData, PrimaryKeyConstraint, String, Table, inspect, text

from store.db._engine import SQLITE_BEGIN_OPTION

if TYPE_CHECKING:  # Alembic is imported only when a database needs upgrading
    from alembic.config import Config

# The newest revision in store/migrations/versions; a test checks it against Alembic's head.
HEAD_REVISION = "0005"
MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"
# The store's Alembic version table (store/migrations/env.py passes it to Alembic).
VERSION_TABLE = "memplan_alembic_version"
# Where memplan kept its revision before VERSION_TABLE, and the revisions it could have written there
# (0005 only on a development branch, before the two met).
LEGACY_VERSION_TABLE = "alembic_version"
LEGACY_REVISIONS = ("0001", "0002", "0003", "0004", "0005")
# PostgreSQL: the transaction-scoped advisory lock that makes concurrent first opens migrate one at a time
# (SQLite's BEGIN IMMEDIATE does it there): the bytes of "memplan" read as one bigint.
SCHEMA_LOCK_KEY = int.from_bytes(b"memplan", "big")


class SchemaVersionError(Exception):
    """The database's schema version is one this memplan does not know (made by a newer memplan)."""


def stored_revision(conn: Connection) -> str | None:
    """The revision the store's tables are at, or None when it has none (a new database, or one that
    holds only other applications' tables). Reads ``VERSION_TABLE``, else a store revision left in
    ``LEGACY_VERSION_TABLE`` by a memplan before the rename.
    """
    return _schema_state(conn)[0]


def _schema_state(conn: Connection) -> tuple[str | None, bool]:
    """``(revision, legacy)``: the store's revision (as ``stored_revision``) and whether it still lies in
    ``LEGACY_VERSION_TABLE``."""
    found = inspect(conn)
    if found.has_table(VERSION_TABLE):
        return _single_version(conn, VERSION_TABLE), False
    if found.has_table(LEGACY_VERSION_TABLE):
        legacy = _single_version(conn, LEGACY_VERSION_TABLE)
        if legacy in LEGACY_REVISIONS:
            return legacy, True
    return None, False


def _single_version(conn: Connection, table: str) -> str | None:
    """The one ``version_num`` of Alembic version table ``table``, or None (empty, or several rows)."""
    rows = conn.execute(text(f"SELECT version_num FROM {table}")).scalars().all()
    return str(rows[0]) if len(rows) == 1 else None


def ensure_schema(engine: Engine, read_only: bool = False) -> None:
    """Bring the database to ``HEAD_REVISION``, creating it when empty; one transaction, all or nothing.

    A revision still kept in ``LEGACY_VERSION_TABLE`` moves to ``VERSION_TABLE`` in that transaction
    (see the module docstring). Raises SchemaVersionError for a revision the scripts do not know, or
    for a database not at ``HEAD_REVISION`` when ``read_only`` (it cannot be upgraded), and SQLAlchemy
    errors as they come (not a database, no permission, a table in the way, a server out of reach).
    """
    with engine.connect() as conn:
        current, legacy = _schema_state(conn)
        conn.rollback()
    if current == HEAD_REVISION and (read_only or not legacy):
        return  # read only: tables at head work wherever their version is kept
    if read_only:
        state = "has no memplan tables yet" if current is None else f"is at the older schema {current!r}"
        raise SchemaVersionError(f"it {state} and mode=ro cannot upgrade it; open it once without mode=ro")
    with engine.connect() as conn:
        conn.execution_options(**{SQLITE_BEGIN_OPTION: "BEGIN IMMEDIATE"})
        with conn.begin():
            _lock_schema(conn)
            current, legacy = _schema_state(conn)  # again, under the lock: another process may have won
            if legacy:
                _move_legacy_version(conn, current)
            if current != HEAD_REVISION:
                _upgrade(conn, current)


def _lock_schema(conn: Connection) -> None:
    """Serialise schema changes of concurrent first opens (PostgreSQL: an advisory lock held until the
    transaction ends; SQLite's BEGIN IMMEDIATE already holds the write lock)."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": SCHEMA_LOCK_KEY})


def _move_legacy_version(conn: Connection, revision: str | None) -> None:
    """Move the store's ``revision`` from ``LEGACY_VERSION_TABLE`` to a new ``VERSION_TABLE`` (laid out as
    Alembic makes it) and drop the legacy table, which held nothing else; inside the open transaction."""
    table = Table(
        VERSION_TABLE,
        MetaData(),
        Column("version_num", String(32), nullable=False),
        PrimaryKeyConstraint("version_num", name=f"{VERSION_TABLE}_pkc"),
    )
    conn.execute(text(f"DROP TABLE {LEGACY_VERSION_TABLE}"))
    table.create(conn)
    conn.execute(table.insert().values(version_num=revision))


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
