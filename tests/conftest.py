"""Fixtures every test package may use: a real PostgreSQL server (``tests/pg_server.py`` says where it
comes from), and an empty database on it per test.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pg_server import NoPostgres, PostgresFailed, PostgresServer, get_server, required


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """The PostgreSQL server of this test session, started on first use and stopped at the end; the
    tests that use it skip, with the reason, where there is none."""
    try:
        server = get_server()
    except NoPostgres as exc:
        if required():
            pytest.fail(f"{exc} (and $MEMPLAN_TEST_POSTGRES_REQUIRED is set)")
        pytest.skip(str(exc))
    except PostgresFailed as exc:
        pytest.fail(str(exc))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """The SQLAlchemy URL (``postgresql+psycopg://...``) of an empty database for this test: a fresh
    schema that the URL's connections use as their only one (``PostgresServer.create_schema``), dropped
    after the test. Close what opened it before the test ends."""
    url = postgres_server.create_schema()
    try:
        yield url
    finally:
        postgres_server.drop_schema(url)
