"""Fixtures of every test: no test reads or writes the user's own plan database, and a real PostgreSQL
server (``tests/pg_server.py`` says where it comes from) with an empty database on it per test.

``PLANNER_DB`` and ``XDG_DATA_HOME`` point at a throwaway folder for the whole session, so a command or API
call that names no ``db`` (``predict`` looking up a calibration, ``recommend`` saving its plan) meets an
empty database of its own, never the developer's probes and calibrations.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pg_server import NoPostgres, PostgresFailed, PostgresServer, get_server, required

from probes.process.op_cache import default_ops_folder

# every test phase within a CPU-seconds budget (tests/cpu_budget.py); pytester runs that check on itself
pytest_plugins = ["cpu_budget", "pytester"]


@pytest.fixture(scope="session", autouse=True)
def guard_default_database(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Point PLANNER_DB and the user data folder at a throwaway place for the whole session."""
    home = tmp_path_factory.mktemp("guard")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PLANNER_DB", str(home / "guard.db"))
        mp.setenv("XDG_DATA_HOME", str(home / "xdg"))
        mp.setenv("DS_ACCELERATOR", "cpu")
        # DeepSpeed's ops loaded in this process and in the probe children: one folder, memplan's own
        mp.setenv("TORCH_EXTENSIONS_DIR", os.environ.get("TORCH_EXTENSIONS_DIR") or str(default_ops_folder("cpu")))
        yield home / "guard.db"


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


@pytest.fixture
def sql_ascii_url(postgres_server: PostgresServer) -> Iterator[str]:
    """A database created as ``initdb`` creates them under the C locale: encoding SQL_ASCII."""
    name = f"memplan_test_{uuid.uuid4().hex[:12]}"
    postgres_server._admin(f"CREATE DATABASE \"{name}\" ENCODING 'SQL_ASCII' TEMPLATE template0")
    url = postgres_server.admin_url.set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        postgres_server.drop_database(url)
