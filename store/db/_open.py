"""Which database to open: an explicit URL or path, then $PLANNER_DB, then a file in the user data dir."""

from __future__ import annotations

import os
from pathlib import Path

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


def database_exists(url: str | None = None) -> bool:
    """Whether the database ``open_storage(url)`` would open is there already: a SQLite file that exists,
    or any server URL (it is asked when opened). Reading commands use this to avoid creating a database
    just to find nothing in it. InputError as ``open_storage`` for a URL it refuses."""
    from store.db._url import resolve_db

    target = resolve_db(url if url is not None else default_db_url())
    if target.memory:
        return False
    return target.path is None or target.path.exists()
