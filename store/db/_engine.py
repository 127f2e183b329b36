"""Engines for the plan database: SQLite gets a busy timeout, durable commits and real (transactional-DDL)
BEGINs; its file gets its folder before it is opened. A server database (PostgreSQL) gets a connect
timeout and connections checked before use.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from sqlalchemy import URL, Connection, Engine, create_engine, event
from sqlalchemy.pool import StaticPool

BUSY_TIMEOUT_S = 15.0
# Execution option naming the statement that opens a SQLite transaction ("BEGIN IMMEDIATE" takes the
# write lock at once, so two processes creating the same database migrate it one after the other).
SQLITE_BEGIN_OPTION = "memplan_sqlite_begin"
# Durability. The journal stays SQLite's default rollback journal (DELETE), not WAL: WAL needs shared
# memory that network file systems (the NFS or Lustre homes of GPU clusters) do not give, leaves -wal
# and -shm files beside the database, and a read-only open (?mode=ro) needs those files; memplan writes one
# small transaction per plan or probe, so WAL's faster commits buy nothing here. With the rollback
# journal a killed process (kill -9) loses only its open transaction: the next open rolls the hot
# journal back. synchronous=FULL (SQLite's default, set here so that no build's default changes it)
# also keeps every committed plan across a power loss or an OS crash, for one more fsync per commit.
SQLITE_PRAGMAS = ("PRAGMA synchronous = FULL",)
# How long a PostgreSQL connection attempt may take before it fails (libpq waits forever by default:
# a host that drops packets would hang every command); a URL's own ?connect_timeout= wins.
POSTGRES_CONNECT_TIMEOUT_S = 10
LIBPQ_DRIVERS = ("postgresql", "postgresql+psycopg", "postgresql+psycopg2")  # those that take connect_timeout


def libpq_defaults(url: URL) -> dict[str, Any]:
    """The connection parameters a PostgreSQL URL gets unless it names them: a connect timeout, and UTF-8 as
    the client encoding. A database created under the C locale has the encoding SQL_ASCII, where the server
    sends text in whatever encoding the client says and psycopg, told SQL_ASCII, hands out bytes that neither
    SQLAlchemy nor Optuna can read; with UTF-8 text goes through as it was stored."""
    defaults: dict[str, Any] = {"connect_timeout": POSTGRES_CONNECT_TIMEOUT_S, "client_encoding": "utf8"}
    return {key: value for key, value in defaults.items() if key not in url.query}


def is_sqlite(url: URL) -> bool:
    """Whether ``url`` names a SQLite database."""
    return url.get_backend_name() == "sqlite"


def prepare_sqlite_file(path: Path, mode: str = "rwc") -> list[Path]:
    """Make ready to open the SQLite file ``path`` in ``mode`` (``rwc``, ``rw`` or ``ro``): create its
    missing folders for ``rwc``, require the file for the others. Returns the folders it created, top
    first, so that a failed open can remove them again; raises OSError with a readable reason.
    """
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder, not a database file")
    check_database_file(path)
    if mode != "rwc":
        if not path.is_file():
            raise FileNotFoundError(f"there is no database file {path} (mode={mode} opens only an existing one)")
        return []
    folder = path.parent
    missing: list[Path] = []
    for ancestor in (folder, *folder.parents):
        if ancestor.exists():
            if not ancestor.is_dir():
                raise NotADirectoryError(f"{ancestor} is a file, not a folder")
            break
        missing.insert(0, ancestor)
    created: list[Path] = []
    try:
        for one in missing:
            one.mkdir(exist_ok=True)
            created.append(one)
    except OSError:
        remove_folders(created)
        raise
    if not path.exists() and not os.access(folder, os.W_OK):
        remove_folders(created)
        raise PermissionError(f"folder {folder} is not writable")
    return created


class NotADatabaseFile(OSError):
    """A file that is there and is not a SQLite database (or not a regular file): never opened as one."""


SQLITE_HEADER = b"SQLite format 3\x00"


def check_database_file(path: Path) -> None:
    """NotADatabaseFile when ``path`` exists but is no SQLite database: a pipe or a device (opening it could
    wait forever), or a non-empty file that does not start with SQLite's header (SQLite would write a new
    database over some of them: a one-byte file, for one). An empty file is a new database, as for SQLite."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return
    if not stat.S_ISREG(info.st_mode):
        raise NotADatabaseFile(f"{path} is not a regular file (a pipe or a device), not a database file")
    if info.st_size == 0:
        return
    with path.open("rb") as handle:
        head = handle.read(len(SQLITE_HEADER))
    if head != SQLITE_HEADER:
        raise NotADatabaseFile(f"{path} is not a SQLite database (file is not a database); memplan leaves it as is")


def remove_folders(created: list[Path]) -> None:
    """Remove the folders ``prepare_sqlite_file`` created (deepest first) where they are still empty."""
    for folder in reversed(created):
        try:
            folder.rmdir()
        except OSError:
            return  # not empty (something else was written there) or gone: leave the rest


def make_engine(url: URL, in_memory: bool = False) -> Engine:
    """An engine for ``url`` (``in_memory``: a SQLite database in memory). Raises ImportError when its
    driver is missing.
    """
    if not is_sqlite(url):
        # A tune keeps its storage open for hours: a connection the server or a firewall dropped meanwhile
        # is replaced before use instead of failing the next save.
        server_kwargs: dict[str, Any] = {"pool_pre_ping": True}
        if url.drivername in LIBPQ_DRIVERS:
            server_kwargs["connect_args"] = libpq_defaults(url)
        return create_engine(url, **server_kwargs)
    kwargs: dict[str, Any] = {"connect_args": {"timeout": BUSY_TIMEOUT_S}}
    if in_memory:
        kwargs["poolclass"] = StaticPool  # one shared connection, or every session sees an empty DB
        kwargs["connect_args"]["check_same_thread"] = False
    engine = create_engine(url, **kwargs)
    event.listen(engine, "connect", _sqlite_on_connect)
    event.listen(engine, "begin", _sqlite_on_begin)
    return engine


def _sqlite_on_connect(dbapi_connection: Any, connection_record: Any) -> None:
    """Stop pysqlite from managing transactions itself (it would commit DDL outside them), and make
    every commit durable (``SQLITE_PRAGMAS``).
    """
    dbapi_connection.isolation_level = None
    for pragma in SQLITE_PRAGMAS:
        dbapi_connection.execute(pragma)


def _sqlite_on_begin(conn: Connection) -> None:
    """Open the transaction SQLAlchemy asked for, with the BEGIN variant the connection requests."""
    conn.exec_driver_sql(conn.get_execution_options().get(SQLITE_BEGIN_OPTION, "BEGIN"))
