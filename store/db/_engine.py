"""Engines for the plan database: SQLite gets a busy timeout and real (transactional-DDL) BEGINs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sqlalchemy import URL, Connection, Engine, create_engine, event
from sqlalchemy.pool import StaticPool

BUSY_TIMEOUT_S = 15.0
# Execution option naming the statement that opens a SQLite transaction ("BEGIN IMMEDIATE" takes the
# write lock at once, so two processes creating the same database migrate it one after the other).
SQLITE_BEGIN_OPTION = "memplan_sqlite_begin"


def is_sqlite(url: URL) -> bool:
    """Whether ``url`` names a SQLite database."""
    return url.get_backend_name() == "sqlite"


def sqlite_file(url: URL) -> Path | None:
    """The file of a SQLite URL, or None for an in-memory database."""
    database = url.database
    if not database or database == ":memory:" or url.query.get("mode") == "memory":
        return None
    return Path(database)


def prepare_sqlite_file(path: Path) -> None:
    """Create the folder of a SQLite file; raise OSError with a readable reason when it cannot be used."""
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder, not a database file")
    folder = path.parent
    for ancestor in (folder, *folder.parents):
        if ancestor.exists():
            if not ancestor.is_dir():
                raise NotADirectoryError(f"{ancestor} is a file, not a folder")
            break
    folder.mkdir(parents=True, exist_ok=True)
    if not path.exists() and not os.access(folder, os.W_OK):
        raise PermissionError(f"folder {folder} is not writable")


def make_engine(url: URL) -> Engine:
    """An engine for ``url``. Raises ImportError when its driver is missing."""
    if not is_sqlite(url):
        return create_engine(url)
    kwargs: dict[str, Any] = {"connect_args": {"timeout": BUSY_TIMEOUT_S}}
    if sqlite_file(url) is None:
        kwargs["poolclass"] = StaticPool  # one shared connection, or every session sees an empty DB
        kwargs["connect_args"]["check_same_thread"] = False
    engine = create_engine(url, **kwargs)
    event.listen(engine, "connect", _sqlite_on_connect)
    event.listen(engine, "begin", _sqlite_on_begin)
    return engine


def _sqlite_on_connect(dbapi_connection: Any, connection_record: Any) -> None:
    """Stop pysqlite from managing transactions itself (it would commit DDL outside them)."""
    dbapi_connection.isolation_level = None


def _sqlite_on_begin(conn: Connection) -> None:
    """Open the transaction SQLAlchemy asked for, with the BEGIN variant the connection requests."""
    conn.exec_driver_sql(conn.get_execution_options().get(SQLITE_BEGIN_OPTION, "BEGIN"))
