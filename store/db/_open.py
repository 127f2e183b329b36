"""Which database to open: an explicit URL or path, then $PLANNER_DB, then a file in the user data dir."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

from store.db._base import BaseStorage

ENV_VAR = "PLANNER_DB"
APP_NAME = "memplan"
DB_FILENAME = "memplan.db"


def default_db_url() -> str:
    """The URL that ``open_storage()`` opens when given none: ``$PLANNER_DB`` if set, else the file
    ``memplan.db`` in the user data folder (``platformdirs.user_data_dir("memplan")``).
    """
    from_env = os.environ.get(ENV_VAR, "").strip()
    if from_env:
        return normalize_db_url(from_env)
    return sqlite_url(Path(platformdirs.user_data_dir(APP_NAME)) / DB_FILENAME)


def normalize_db_url(url_or_path: str) -> str:
    """A SQLAlchemy URL for ``url_or_path``: URLs (``scheme://...``) pass unchanged; anything else is a
    file path, made absolute, for a SQLite database.
    """
    text = url_or_path.strip()
    if "://" in text:
        return text
    return sqlite_url(Path(text).expanduser())


def sqlite_url(path: Path) -> str:
    """The SQLAlchemy URL of a SQLite file."""
    return f"sqlite:///{path.resolve()}"


def open_storage(url: str | None = None) -> BaseStorage:
    """Open the plan database, creating it (and its folder) or upgrading its schema as needed.

    ``url`` is a SQLAlchemy URL or a plain file path (a SQLite file); when None or empty,
    ``default_db_url()`` decides. A place that cannot be written, a file that is not a database, or a
    database from a newer memplan raises InputError with one line: ``cannot open database URL: why``.

    Example::

        with open_storage("plans.db") as storage:
            print(storage.latest_plan())
    """
    from store.db._sqlalchemy import SQLAlchemyStorage  # SQLAlchemy takes ~0.5 s to import: only when used

    chosen = normalize_db_url(url) if url and url.strip() else default_db_url()
    return SQLAlchemyStorage(chosen)
