"""The storage backends every storage-contract test runs against (test_db.py, test_db_probes.py, ...).

To check a new backend, add a factory to ``BACKENDS``: it gets the test's request (to ask for the
fixtures it needs) and a fresh folder, and returns a function that opens (or reopens) the same database
each time it is called. ``sqlalchemy-postgresql`` runs on a real PostgreSQL server (the ``postgres_url``
fixture of ``tests/conftest.py``) and skips, saying why, where there is none.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from store.db import BaseStorage, SQLAlchemyStorage

Opener = Callable[[], BaseStorage]


def _sqlalchemy_sqlite_file(request: pytest.FixtureRequest, folder: Path) -> Opener:
    """SQLAlchemyStorage on a SQLite file."""
    url = f"sqlite:///{folder / 'plans.db'}"
    return lambda: SQLAlchemyStorage(url)


def _sqlalchemy_postgresql(request: pytest.FixtureRequest, folder: Path) -> Opener:
    """SQLAlchemyStorage on a new database of a real PostgreSQL server."""
    url: str = request.getfixturevalue("postgres_url")
    return lambda: SQLAlchemyStorage(url)


BACKENDS: dict[str, Callable[[pytest.FixtureRequest, Path], Opener]] = {
    "sqlalchemy-sqlite-file": _sqlalchemy_sqlite_file,
    "sqlalchemy-postgresql": _sqlalchemy_postgresql,
}


@pytest.fixture(params=sorted(BACKENDS))
def reopen(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    """Opens the same database of the backend under test; every storage it opened is closed at the end."""
    factory = BACKENDS[request.param](request, tmp_path)
    opened: list[BaseStorage] = []

    def open_one() -> BaseStorage:
        storage = factory()
        opened.append(storage)
        return storage

    yield open_one
    for storage in opened:
        storage.close()


@pytest.fixture
def storage(reopen: Opener) -> BaseStorage:
    """A storage with an empty database."""
    return reopen()
