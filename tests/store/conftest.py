"""The storage backends every storage-contract test runs against (test_db.py, test_db_probes.py).

To check a new backend, add a factory to ``BACKENDS``: it gets a fresh folder and returns a function
that opens (or reopens) the same database each time it is called.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from store.db import BaseStorage, SQLAlchemyStorage

Opener = Callable[[], BaseStorage]


def _sqlalchemy_sqlite_file(folder: Path) -> Opener:
    """SQLAlchemyStorage on a SQLite file."""
    url = f"sqlite:///{folder / 'plans.db'}"
    return lambda: SQLAlchemyStorage(url)


BACKENDS: dict[str, Callable[[Path], Opener]] = {"sqlalchemy-sqlite-file": _sqlalchemy_sqlite_file}


@pytest.fixture(params=sorted(BACKENDS))
def reopen(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    """Opens the same database of the backend under test; every storage it opened is closed at the end."""
    factory = BACKENDS[request.param](tmp_path)
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
