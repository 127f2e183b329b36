"""Opening the plan database: where it lives, what cannot be opened, and schema versions (Alembic)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import platformdirs
import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect, select

import store.db._engine as engine_module
from store.db import BaseStorage, SQLAlchemyStorage, default_db_url, open_storage
from store.db._orm import Base, PlanRow
from store.db._schema import HEAD_REVISION, MIGRATIONS_DIR, VERSION_TABLE, alembic_config
from store.errors import InputError

# compare_metadata must know the store's version table to leave it out of the comparison.
VERSION_OPTS = {"version_table": VERSION_TABLE}

REPO = Path(__file__).resolve().parents[2]


def plan(kind: str = "sft") -> dict[str, object]:
    """The smallest valid save_plan arguments."""
    return {
        "kind": kind,
        "model": "opt-125m",
        "fits": True,
        "workload": {"kind": kind},
        "hardware": {"gpus": 1},
        "strategy": {"zero_stage": 0},
        "predicted": {"peak_allocated_bytes": 1},
        "ds_config": {"zero_optimization": {"stage": 0}},
        "document": {"fits": True},
    }


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """Where a test's database file goes (not created yet)."""
    return tmp_path / "plans.db"


@pytest.fixture
def no_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No PLANNER_DB in the environment."""
    monkeypatch.delenv("PLANNER_DB", raising=False)
    yield


def stored_versions(path: Path) -> list[str]:
    """The rows of memplan_alembic_version, read with the sqlite3 module."""
    with sqlite3.connect(path) as conn:
        return [row[0] for row in conn.execute("SELECT version_num FROM memplan_alembic_version")]


def run_python(code: str, cwd: Path) -> str:
    """Run ``code`` in a fresh interpreter from the repository and return its stdout."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


# Schema versions ------------------------------------------------------------------------------------


def test_head_constant_matches_the_migration_scripts() -> None:
    assert ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head() == HEAD_REVISION


def test_a_new_database_is_created_at_head(db_path: Path) -> None:
    SQLAlchemyStorage(f"sqlite:///{db_path}").close()
    assert stored_versions(db_path) == [HEAD_REVISION]
    engine = create_engine(f"sqlite:///{db_path}")
    try:
        indexes = {ix["name"]: ix for ix in inspect(engine).get_indexes("plans")}
        assert indexes["ix_plans_created_at"]["column_names"] == ["created_at"]
        assert indexes["ix_plans_kind"]["column_names"] == ["kind"]
        assert indexes["ix_plans_plan_id"]["unique"]
        with engine.connect() as conn:  # the ORM rows describe exactly what the migrations built
            assert compare_metadata(MigrationContext.configure(conn, opts=VERSION_OPTS), Base.metadata) == []
    finally:
        engine.dispose()


def test_an_empty_file_becomes_a_database(db_path: Path) -> None:
    db_path.touch()
    with SQLAlchemyStorage(f"sqlite:///{db_path}") as storage:
        storage.save_plan(**plan())
    assert stored_versions(db_path) == [HEAD_REVISION]


def test_a_database_behind_head_is_upgraded_and_keeps_nothing_half_done(db_path: Path) -> None:
    url = f"sqlite:///{db_path}"
    SQLAlchemyStorage(url).close()
    config = alembic_config()
    config.set_main_option("sqlalchemy.url", url)
    command.downgrade(config, "base")
    assert stored_versions(db_path) == []

    with SQLAlchemyStorage(url) as storage:
        assert storage.list_plans() == []
        storage.save_plan(**plan())
    assert stored_versions(db_path) == [HEAD_REVISION]


def test_a_database_from_a_newer_memplan_is_refused(db_path: Path) -> None:
    SQLAlchemyStorage(f"sqlite:///{db_path}").close()
    with sqlite3.connect(db_path) as conn:
        conn.execute("UPDATE memplan_alembic_version SET version_num = '9999'")
    with pytest.raises(InputError, match=r"cannot open database .*'9999'.*newer memplan"):
        SQLAlchemyStorage(f"sqlite:///{db_path}")
    assert stored_versions(db_path) == ["9999"]


def test_a_failed_migration_leaves_the_file_as_it_was(db_path: Path) -> None:
    with sqlite3.connect(db_path) as conn:  # someone else's table in the way of ours
        conn.execute("CREATE TABLE plans (x INTEGER)")
    with pytest.raises(InputError, match="cannot open database .*already exists"):
        SQLAlchemyStorage(f"sqlite:///{db_path}")
    with sqlite3.connect(db_path) as conn:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables == {"plans"}  # no alembic_version left behind


def test_reopening_a_database_at_head_does_not_import_alembic(db_path: Path) -> None:
    SQLAlchemyStorage(f"sqlite:///{db_path}").close()
    code = f"""
        import sys
        from store.db import open_storage
        storage = open_storage({str(db_path)!r})
        storage.save_plan(kind="sft", model="m", fits=True, workload={{}}, hardware={{}}, strategy={{}},
                          predicted={{}}, ds_config={{}}, document={{}})
        print(len(storage.list_plans()), "alembic" in sys.modules)
    """
    assert run_python(code, db_path.parent).split() == ["1", "False"]


def test_importing_store_db_loads_neither_alembic_nor_sqlalchemy(tmp_path: Path) -> None:
    code = """
        import sys
        import store.db
        print("alembic" in sys.modules, "sqlalchemy" in sys.modules)
    """
    assert run_python(code, tmp_path).split() == ["False", "False"]


def test_processes_creating_one_database_at_once_all_succeed(db_path: Path) -> None:
    code = f"""
        from store.db import open_storage
        storage = open_storage({str(db_path)!r})
        storage.save_plan(kind="sft", model="m", fits=True, workload={{}}, hardware={{}}, strategy={{}},
                          predicted={{}}, ds_config={{}}, document={{}})
    """
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env, stderr=subprocess.PIPE)
        for _ in range(3)
    ]
    errors = [proc.communicate()[1].decode() for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * 3, errors
    assert stored_versions(db_path) == [HEAD_REVISION]
    with open_storage(str(db_path)) as storage:
        assert len(storage.list_plans()) == 3


# Where the database lives ------------------------------------------------------------------------


def test_open_storage_returns_the_contract(db_path: Path) -> None:
    with open_storage(f"sqlite:///{db_path}") as storage:
        assert isinstance(storage, BaseStorage)
        saved = storage.save_plan(**plan())
    assert db_path.is_file()
    with open_storage(str(db_path)) as storage:
        assert storage.get_plan(saved.plan_id) == saved


def test_a_plain_relative_path_is_a_sqlite_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_env: None) -> None:
    monkeypatch.chdir(tmp_path)
    with open_storage("sub/dir/my plans.db") as storage:
        storage.save_plan(**plan())
    assert stored_versions(tmp_path / "sub" / "dir" / "my plans.db") == [HEAD_REVISION]


def test_planner_db_env_var_is_honoured(tmp_path: Path, db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLANNER_DB", f"sqlite:///{db_path}")
    assert default_db_url() == f"sqlite:///{db_path}"
    with open_storage() as storage:
        saved = storage.save_plan(**plan())
    with open_storage(str(db_path)) as storage:
        assert storage.latest_plan() == saved

    monkeypatch.setenv("PLANNER_DB", str(tmp_path / "from_env.db"))  # a plain path works there too
    with open_storage() as storage:
        storage.save_plan(**plan())
    assert stored_versions(tmp_path / "from_env.db") == [HEAD_REVISION]

    with open_storage(str(tmp_path / "argument.db")) as storage:  # an argument beats the env var
        assert storage.list_plans() == []
    assert (tmp_path / "argument.db").is_file()


@pytest.mark.skipif(sys.platform != "linux", reason="points the user data folder elsewhere via XDG")
def test_default_is_memplan_db_in_the_user_data_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_env: None
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    expected = Path(platformdirs.user_data_dir("memplan")) / "memplan.db"
    assert expected.is_relative_to(tmp_path)
    assert default_db_url() == f"sqlite:///{expected}"
    with open_storage() as storage:
        storage.save_plan(**plan())
    assert stored_versions(expected) == [HEAD_REVISION]


def test_in_memory_sqlite_keeps_plans_for_the_storage_lifetime() -> None:
    with SQLAlchemyStorage("sqlite://") as storage:
        saved = storage.save_plan(**plan())
        assert storage.get_plan(saved.plan_id) == saved


# What cannot be opened ----------------------------------------------------------------------------


def assert_one_line_open_error(url: str, reason: str) -> None:
    """Opening ``url`` raises InputError with one line naming the database and the reason."""
    with pytest.raises(InputError) as info:
        open_storage(url)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("cannot open database ")
    assert reason in message, message


def test_a_path_under_a_regular_file_is_input_error(tmp_path: Path) -> None:
    (tmp_path / "file.txt").write_text("hello")
    assert_one_line_open_error(str(tmp_path / "file.txt" / "plans.db"), "file.txt")
    assert_one_line_open_error(f"sqlite:///{tmp_path}/file.txt/sub/plans.db", "file.txt")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes anywhere")
def test_a_file_in_a_read_only_folder_is_input_error(tmp_path: Path) -> None:
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        assert_one_line_open_error(str(folder / "plans.db"), "not writable")
    finally:
        folder.chmod(0o700)


def test_a_folder_is_input_error(tmp_path: Path) -> None:
    assert_one_line_open_error(str(tmp_path), "is a folder")


def test_a_file_that_is_not_a_database_is_input_error(tmp_path: Path) -> None:
    text_file = tmp_path / "notes.db"
    text_file.write_text("these are my notes, not a database\n" * 100)
    assert_one_line_open_error(str(text_file), "not a database")
    assert text_file.read_text().startswith("these are my notes")


def test_an_unknown_url_scheme_is_input_error() -> None:
    assert_one_line_open_error("nosuchdb://host/db", "nosuchdb")


def test_a_password_never_appears_in_errors() -> None:
    with pytest.raises(InputError) as info:
        open_storage("postgresql://user:secret@127.0.0.1:1/plans")
    assert "secret" not in str(info.value)
    assert "***" in str(info.value)


def test_a_locked_database_is_input_error(db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    SQLAlchemyStorage(f"sqlite:///{db_path}").close()
    monkeypatch.setattr(engine_module, "BUSY_TIMEOUT_S", 0.05)
    storage = SQLAlchemyStorage(f"sqlite:///{db_path}")
    other = sqlite3.connect(db_path, isolation_level=None)
    try:
        other.execute("BEGIN EXCLUSIVE")
        with pytest.raises(InputError, match="cannot use database .*locked"):
            storage.save_plan(**plan())
        other.execute("ROLLBACK")
        storage.save_plan(**plan())
        assert len(storage.list_plans()) == 1
    finally:
        other.close()
        storage.close()


# The one session scope ----------------------------------------------------------------------------


def test_the_session_scope_rolls_back_everything_on_failure(db_path: Path) -> None:
    storage = SQLAlchemyStorage(f"sqlite:///{db_path}")
    saved = storage.save_plan(**plan())
    with pytest.raises(RuntimeError, match="midway"), storage._session_scope() as session:
        session.add(PlanRow(**{**plan(), "plan_id": "0123456789ab", "created_at": saved.created_at}))
        session.flush()  # the row is in the database's transaction now
        assert len(session.scalars(select(PlanRow)).all()) == 2
        raise RuntimeError("midway")
    assert storage.list_plans() == [saved]
    storage.close()
