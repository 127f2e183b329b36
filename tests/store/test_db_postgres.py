"""The store on a real PostgreSQL server (issue 11, a team database): the migrations build exactly the ORM's
tables there and go down and up again, concurrent first opens migrate once, a database written before the
store's own version table moves its version, and what the environment gets wrong (a server out of reach,
a wrong password, a missing database, a missing driver, a value the server refuses) is one InputError line
with the password hidden. The storage contract itself runs on PostgreSQL through ``conftest.py``.

The server comes from the ``postgres_url`` fixture (``tests/pg_server.py``): the tests skip, saying why,
where there is none.
"""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from cli_here import run_planner_here
from pg_server import PostgresServer
from sqlalchemy import create_engine, inspect, make_url, text

from store.db import SQLAlchemyStorage, open_storage
from store.db._orm import Base
from store.db._schema import HEAD_REVISION, LEGACY_VERSION_TABLE, VERSION_TABLE, alembic_config
from store.errors import InputError
from store.measurements import ProbeRequest, ProbeResult

REPO = Path(__file__).resolve().parents[2]
CHILD_TIMEOUT_S = 120.0  # a safety net against a hang; no assertion depends on time
PLAN: dict[str, Any] = dict(
    kind="sft", model="m", fits=True, workload={}, hardware={}, strategy={}, predicted={}, ds_config={}, document={}
)


def run_sql(url: str, *statements: str) -> list[Any]:
    """Run ``statements`` in one transaction on ``url``; the rows of the last one."""
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            rows: list[Any] = []
            for statement in statements:
                result = conn.execute(text(statement))
                rows = list(result) if result.returns_rows else []
            return rows
    finally:
        engine.dispose()


def tables(url: str) -> set[str]:
    """The table names of the database (its default schema)."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return set(inspect(conn).get_table_names())
    finally:
        engine.dispose()


def test_a_new_database_is_exactly_the_orm(postgres_url: str) -> None:
    with open_storage(postgres_url) as storage:
        storage.save_plan(**PLAN)
    assert tables(postgres_url) == {VERSION_TABLE, *Base.metadata.tables}
    assert run_sql(postgres_url, f"SELECT version_num FROM {VERSION_TABLE}") == [(HEAD_REVISION,)]
    engine = create_engine(postgres_url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
            assert compare_metadata(context, Base.metadata) == []
            columns = {c["name"]: c["type"] for c in inspect(conn).get_columns("probes")}
            artifact_columns = {c["name"]: c["type"] for c in inspect(conn).get_columns("probe_artifacts")}
    finally:
        engine.dispose()
    # What PostgreSQL made of the portable types: native JSON, timestamps with time zone, bytea, bigint.
    assert str(columns["request"]) == "JSON" and str(columns["created_at"]) == "TIMESTAMP"
    assert columns["created_at"].timezone  # type: ignore[attr-defined]
    assert str(columns["peak_allocated_bytes"]) == "BIGINT" and str(artifact_columns["data"]) == "BYTEA"


def test_the_migrations_go_down_to_nothing_and_up_again(postgres_url: str) -> None:
    with open_storage(postgres_url) as storage:
        saved = storage.save_plan(**PLAN)
    config = alembic_config()
    config.set_main_option("sqlalchemy.url", postgres_url.replace("%", "%%"))
    command.downgrade(config, "0001")
    assert tables(postgres_url) == {VERSION_TABLE, "plans"}
    command.downgrade(config, "base")
    assert tables(postgres_url) == {VERSION_TABLE}
    command.upgrade(config, "0002")
    with open_storage(postgres_url) as storage:  # 0002 -> head on open
        assert storage.list_plans() == []
        assert storage.save_plan(**PLAN).plan_id != saved.plan_id
    assert run_sql(postgres_url, f"SELECT version_num FROM {VERSION_TABLE}") == [(HEAD_REVISION,)]


def test_processes_creating_one_database_at_once_all_succeed(postgres_url: str) -> None:
    code = textwrap.dedent(
        """
        import sys
        from store.db import open_storage
        sys.stdin.readline()  # all start together
        with open_storage(sys.argv[1]) as storage:
            storage.save_plan(kind="sft", model="m", fits=True, workload={}, hardware={}, strategy={},
                              predicted={}, ds_config={}, document={})
        print("ok")
        """
    )
    children = [
        subprocess.Popen(
            [sys.executable, "-c", code, postgres_url],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    for child in children:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
    for child in children:
        out, err = child.communicate(timeout=CHILD_TIMEOUT_S)
        assert (child.returncode, out.strip()) == (0, "ok"), err
    with open_storage(postgres_url) as storage:
        assert len(storage.list_plans()) == 4


def test_a_database_from_before_the_version_table_moves_its_version(postgres_url: str) -> None:
    with open_storage(postgres_url) as storage:
        saved = storage.save_plan(**PLAN)
    # As a memplan before the rename left it: the store's revision in alembic_version (Alembic's layout).
    run_sql(
        postgres_url,
        f"ALTER TABLE {VERSION_TABLE} RENAME TO {LEGACY_VERSION_TABLE}",
        f"ALTER TABLE {LEGACY_VERSION_TABLE} RENAME CONSTRAINT {VERSION_TABLE}_pkc TO {LEGACY_VERSION_TABLE}_pkc",
    )
    with open_storage(postgres_url) as storage:
        assert storage.list_plans() == [saved]
    assert LEGACY_VERSION_TABLE not in tables(postgres_url)
    assert run_sql(postgres_url, f"SELECT version_num FROM {VERSION_TABLE}") == [(HEAD_REVISION,)]


def test_an_alembic_version_of_someone_else_is_left_alone(postgres_url: str) -> None:
    run_sql(
        postgres_url,
        f"CREATE TABLE {LEGACY_VERSION_TABLE} (version_num VARCHAR(32) NOT NULL PRIMARY KEY)",
        f"INSERT INTO {LEGACY_VERSION_TABLE} VALUES ('v3.2.0.a')",
    )
    with open_storage(postgres_url) as storage:
        storage.save_plan(**PLAN)
    assert run_sql(postgres_url, f"SELECT version_num FROM {LEGACY_VERSION_TABLE}") == [("v3.2.0.a",)]


def free_port() -> int:
    """A local TCP port nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def one_line_error(url: str) -> str:
    """The InputError ``open_storage(url)`` raises; checked to be one line without the password."""
    with pytest.raises(InputError) as info:
        open_storage(url)
    message = str(info.value)
    assert "\n" not in message
    password = make_url(url).password
    if password:
        assert str(password) not in message and "***" in message
    return message


def test_a_server_out_of_reach_is_one_line() -> None:
    pytest.importorskip("psycopg", reason="psycopg is not installed (pip install 'memplan[postgres]')")
    message = one_line_error(f"postgresql+psycopg://someone:s3cret-pw@127.0.0.1:{free_port()}/plans")
    assert message.startswith("cannot open database postgresql+psycopg://someone:***@127.0.0.1:")
    assert "refused" in message or "failed" in message


def test_a_missing_database_is_one_line(postgres_server: PostgresServer) -> None:
    url = postgres_server.admin_url.set(database="no_such_memplan_db").render_as_string(hide_password=False)
    assert 'database "no_such_memplan_db" does not exist' in one_line_error(url)


def test_a_wrong_password_is_one_line_and_hidden(postgres_server: PostgresServer) -> None:
    if postgres_server.password_role is None:
        pytest.skip("the server named by $MEMPLAN_TEST_POSTGRES_URL has no role with a known password")
    name, password = postgres_server.password_role
    right = postgres_server.admin_url.set(username=name, password=password)
    wrong = right.set(password="wrong-horse-battery").render_as_string(hide_password=False)
    assert "password authentication failed" in one_line_error(wrong)
    schema_url = postgres_server.create_schema()
    try:  # and the right password opens it: the store passes the password on
        run_sql(schema_url, f"GRANT ALL ON SCHEMA {make_url(schema_url).query['options'].split('=')[1]} TO {name}")
        url = make_url(schema_url).set(username=name, password=password).render_as_string(hide_password=False)
        with open_storage(url) as storage:
            storage.save_plan(**PLAN)
            assert "***" in storage.url and password not in storage.url
    finally:
        postgres_server.drop_schema(schema_url)


def test_plain_postgresql_urls_name_psycopg_3(postgres_url: str) -> None:
    if importlib.util.find_spec("psycopg2") is not None:
        pytest.skip("psycopg2 is installed: plain postgresql:// names it, as SQLAlchemy does")
    for scheme in ("postgresql", "postgres"):
        plain = postgres_url.replace("postgresql+psycopg://", f"{scheme}://", 1)
        with open_storage(plain) as storage:
            assert isinstance(storage, SQLAlchemyStorage)
            assert storage.url.startswith("postgresql+psycopg://")
            storage.save_plan(**PLAN)


def test_a_missing_driver_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as where the postgres extra is not installed: import fails
    with pytest.raises(InputError) as refused:
        open_storage("postgresql+psycopg://someone:s3cret-pw@127.0.0.1:5/plans")
    message = str(refused.value)
    assert message.startswith("cannot open database postgresql+psycopg://someone:***@127.0.0.1:5/plans:")
    assert "pip install 'memplan[postgres]'" in message and "s3cret" not in message


def test_a_value_the_server_refuses_is_input_error_and_writes_nothing(postgres_url: str) -> None:
    with open_storage(postgres_url) as storage:
        with pytest.raises(InputError, match="cannot use database .*NUL"):
            storage.save_plan(**(PLAN | {"model": "bad\x00model"}))
        with pytest.raises(InputError, match="cannot use database .*too long"):
            storage.save_plan(**(PLAN | {"kind": "k" * 40}))
        assert storage.list_plans() == []


def test_a_probe_message_with_a_nul_is_still_saved(postgres_url: str) -> None:
    request = ProbeRequest(workload={"kind": "sft", "model": "opt-125m"}, strategy={}, hardware={})
    result = ProbeResult("error", failed_phase="forward\x00", message="crashed: \x00 in the log")
    with open_storage(postgres_url) as storage:
        saved = storage.save_probe(request, result, key="k")
        assert storage.get_probe(saved.probe_id).result == result  # the record keeps the NUL (JSON)
    assert run_sql(postgres_url, "SELECT message FROM probes") == [("crashed: \ufffd in the log",)]


def test_the_cli_saves_and_lists_plans_on_postgresql(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``planner recommend --db URL`` saves its plan there and ``planner plans`` with ``$PLANNER_DB`` lists it
    (the CLI run in this process: ``planner.cli.main``)."""
    monkeypatch.delenv("PLANNER_DB", raising=False)
    made = run_planner_here(
        ["recommend", "--model", "opt-125m", "--gpu-mem", "24G", "--workload", "sft", "--db", postgres_url]
    )
    assert made.returncode == 0, made.stderr
    with open_storage(postgres_url) as storage:
        plan = storage.latest_plan()
    assert plan is not None and plan.model == "opt-125m"
    monkeypatch.setenv("PLANNER_DB", postgres_url)
    shown = run_planner_here(["plans"])
    assert shown.returncode == 0 and plan.plan_id in shown.stdout, shown.stderr
