"""Which database to open: an explicit URL or path, then $PLANNER_DB, then a file in the user data dir."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import quote

import platformdirs

from store.db._base import BaseStorage
from store.errors import InputError

ENV_VAR = "PLANNER_DB"
APP_NAME = "memplan"
DB_FILENAME = "memplan.db"


def default_db_url() -> str:
    """The URL that ``open_storage()`` opens when given none: ``$PLANNER_DB`` if set (an empty or blank
    value counts as unset), else the file ``memplan.db`` in the user data folder
    (``platformdirs.user_data_dir("memplan")``). A ``$PLANNER_DB`` that names no database it could
    open raises InputError with one line naming ``$PLANNER_DB``.
    """
    from_env = os.environ.get(ENV_VAR, "").strip()
    if from_env:
        return normalize_db_url(from_env, origin=f"${ENV_VAR}")
    return sqlite_url(Path(platformdirs.user_data_dir(APP_NAME)) / DB_FILENAME)


def normalize_db_url(url_or_path: str, origin: str = "") -> str:
    """A SQLAlchemy URL for ``url_or_path``: a file path becomes the URL of that SQLite file, made
    absolute; a URL is checked and comes back in its canonical form. InputError (naming ``origin``
    when given) for anything ``store.db._url.resolve_db`` refuses.
    """
    from store.db._url import resolve_db  # imports SQLAlchemy: only when used

    return resolve_db(url_or_path, origin).url.render_as_string(hide_password=False)


def optuna_storage_url(db: str | os.PathLike[str] | None = None) -> str:
    """The SQLAlchemy URL that Optuna's ``RDBStorage`` should use to keep a study in the same database that
    ``open_storage(db)`` opens (``planner tune`` keeps its study beside the plans and probes, so that a
    tune resumes after an interrupt and several machines can share one study).

    ``db`` is resolved exactly as ``open_storage`` resolves it: a path or URL (checked by
    ``store.db._url.resolve_db``), else ``$PLANNER_DB``, else ``memplan.db`` in the user data folder.
    A SQLite file comes back as ``sqlite:////absolute/path`` (``?mode=rw`` dropped: the store's open
    checks the file exists); a server URL comes back with its password, which Optuna needs to connect
    (never print it). Plain ``postgresql://`` names psycopg 3 as the store does. InputError with one line
    for anything ``open_storage`` refuses, and for what cannot hold a study: an in-memory database (private
    to one storage object) or ``?mode=ro`` (Optuna writes its trials).

    The two share the database without a clash: the store keeps its schema version in
    ``memplan_alembic_version``, Optuna in ``alembic_version``, and no table or index name is shared. Open
    the store first (``open_storage(db)``): a database written by a memplan before that split keeps the
    store's version in ``alembic_version`` until the store opens it once, and Optuna refuses it until then.

    Example::

        import optuna
        from store.db import open_storage, optuna_storage_url

        with open_storage(db) as storage:  # creates or upgrades the store's tables
            study = optuna.create_study(
                storage=optuna_storage_url(db), study_name="tune-opt-1.3b", load_if_exists=True
            )
    """
    from sqlalchemy import URL  # SQLAlchemy takes ~0.5 s to import: only when used

    from store.db._url import resolve_db

    text = default_db_url() if db is None else db
    if isinstance(text, str) and not text.strip():
        raise InputError("cannot open database '': the URL or path is empty; give a file path or a database URL")
    target = resolve_db(text)
    if target.memory:
        raise InputError(
            f"cannot keep an Optuna study in {target.shown}: an in-memory database lives in one storage object;"
            " give a file path or a server URL"
        )
    if target.mode == "ro":
        raise InputError(
            f"cannot keep an Optuna study in {target.shown}: mode=ro opens it read only, and a study writes its"
            " trials; leave out mode=ro"
        )
    if target.path is not None:  # the plain file form (no file: URI), with '%', '#' and '@' escaped
        return URL.create(target.url.drivername, database=str(target.path)).render_as_string(hide_password=False)
    return target.url.render_as_string(hide_password=False)


def sqlite_url(path: Path) -> str:
    """The SQLAlchemy URL of a SQLite file."""
    return f"sqlite:///{path.resolve()}"


def open_storage(url: str | None = None) -> BaseStorage:
    """Open the plan database, creating it (and its folder) or upgrading its schema as needed.

    ``url`` is a SQLAlchemy URL or a plain file path (a SQLite file; ``?mode=ro`` opens it read only,
    ``:memory:`` is a database in memory); when None, ``default_db_url()`` decides. An empty or blank
    ``url``, a URL or path that names no database this can open, a place that cannot be written, a
    file that is not a database, or a database from a newer memplan raises InputError with one line:
    ``cannot open database URL: why``. Nothing is created when opening fails.

    Example::

        with open_storage("plans.db") as storage:
            print(storage.latest_plan())
    """
    from store.db._sqlalchemy import SQLAlchemyStorage  # SQLAlchemy takes ~0.5 s to import: only when used

    if url is None:
        return SQLAlchemyStorage(default_db_url())
    if isinstance(url, str) and not url.strip():
        raise InputError(
            "cannot open database '': the URL or path is empty;"
            " give a file path such as plans.db or a URL such as sqlite:///plans.db"
        )
    return SQLAlchemyStorage(url)


def connect_args(url: str) -> dict[str, Any]:
    """The DBAPI connect arguments an engine of ``url`` (as ``optuna_storage_url`` gives it) needs to reach and
    read the database as the store does: for PostgreSQL a connect timeout and UTF-8 as the client encoding
    (a database created under the C locale is SQL_ASCII, whose text psycopg would otherwise hand out as
    bytes), unless the URL names them; for SQLite the store's busy timeout (Python's sqlite3 waits 5 s for
    another writer's lock, which several tunes of one file on a loaded host outlast). Pass them to Optuna:
    ``RDBStorage(url, engine_kwargs={"connect_args": connect_args(url)})``."""
    from sqlalchemy import make_url

    from store.db._engine import BUSY_TIMEOUT_S, LIBPQ_DRIVERS, libpq_defaults

    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return {"timeout": BUSY_TIMEOUT_S}
    return libpq_defaults(parsed) if parsed.drivername in LIBPQ_DRIVERS else {}


def would_create(url: str | None = None) -> bool:
    """Whether ``open_storage(url)`` would create a new database file: a SQLite file that does not exist,
    opened in the default mode (``rwc``). Commands that only read use this to answer "nothing saved" without
    leaving a database behind (a mistyped ``--db``); with ``mode=ro`` or ``mode=rw`` opening says the file is
    missing. InputError as ``open_storage`` for a URL it refuses."""
    from store.db._url import resolve_db

    target = resolve_db(url if url is not None else default_db_url())
    return target.path is not None and target.mode == "rwc" and not target.path.exists()


def holds_no_store(url: str | None = None) -> bool:
    """Whether opening ``url`` would create the store's tables: a new SQLite file (``would_create``), or an
    existing database that holds none of them (an empty file, another application's database). Commands that
    only read answer "nothing saved" for it and leave it as it is (opening it would add memplan's tables).
    Looks without writing (a SQLite file is opened read only); False when it cannot tell (a database that
    cannot be opened: ``open_storage`` then says why in one line). InputError as ``open_storage`` for a URL it
    refuses."""
    import sqlite3

    from sqlalchemy import create_engine
    from sqlalchemy.exc import SQLAlchemyError

    from store.db._engine import LIBPQ_DRIVERS, libpq_defaults
    from store.db._schema import stored_revision
    from store.db._url import resolve_db

    if would_create(url):
        return True
    target = resolve_db(url if url is not None else default_db_url())
    if target.memory:
        return False
    if target.path is not None and not target.path.is_file():
        return False
    try:
        if target.path is not None:
            uri = f"file:{quote(str(target.path))}?mode=ro"
            engine = create_engine("sqlite://", creator=lambda: sqlite3.connect(uri, uri=True))
        else:
            args = libpq_defaults(target.url) if target.url.drivername in LIBPQ_DRIVERS else {}
            engine = create_engine(target.url, connect_args=args)
    except (SQLAlchemyError, ImportError):  # an unknown dialect, a missing driver: open_storage says it
        return False
    try:
        with engine.connect() as conn:
            return stored_revision(conn) is None
    except (SQLAlchemyError, OSError, sqlite3.Error):
        return False
    finally:
        engine.dispose()


def database_exists(url: str | None = None) -> bool:
    """Whether the database ``open_storage(url)`` would open is there already: a SQLite file that exists,
    or any server URL (it is asked when opened). Reading commands use this to avoid creating a database
    just to find nothing in it. InputError as ``open_storage`` for a URL it refuses."""
    from store.db._url import resolve_db

    target = resolve_db(url if url is not None else default_db_url())
    if target.memory:
        return False
    return target.path is None or target.path.exists()
