"""Database URLs and paths (issue 13): every one a user can type as ``--db`` or ``$PLANNER_DB`` opens
the database it names, or raises InputError with one line and creates nothing (no folder, no file,
never a file with '?' in its name); through ``open_storage`` and through the ``planner`` CLI.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from cli_here import run_planner_here
from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError

import store.db._sqlalchemy as backend
from store.db import open_storage
from store.db._schema import HEAD_REVISION, alembic_config
from store.db._url import MAX_FILE_NAME_BYTES, MAX_SQLITE_PATH_BYTES
from store.errors import InputError

REPO = Path(__file__).resolve().parents[2]
NO_USER = "~nosuchuser_memplan_test"


def plan() -> dict[str, object]:
    """The smallest valid save_plan arguments."""
    return {
        "kind": "sft",
        "model": "opt-125m",
        "fits": True,
        "workload": {"kind": "sft"},
        "hardware": {"gpus": 1},
        "strategy": {"zero_stage": 0},
        "predicted": {"peak_allocated_bytes": 1},
        "ds_config": {"zero_optimization": {"stage": 0}},
        "document": {"fits": True},
    }


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty current folder (relative paths land here) and no $PLANNER_DB."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv("PLANNER_DB", raising=False)
    yield work


def everything_under(folder: Path) -> list[str]:
    """Every file and folder under ``folder``, relative, sorted."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def nested_path(total_chars: int) -> str:
    """A relative path of folders of 100 characters whose absolute form has ``total_chars`` characters."""
    used = len(str(Path.cwd())) + 1
    parts: list[str] = []
    while total_chars - used > 110:
        parts.append("d" * 100)
        used += 101
    parts.append("f" * (total_chars - used - 3) + ".db")
    return "/".join(parts)


def one_line_error(url: str) -> str:
    """The message of the InputError that ``open_storage(url)`` raises, checked to be one short line."""
    with pytest.raises(InputError) as info:
        open_storage(url)
    message = str(info.value)
    assert "\n" not in message and "\r" not in message, message
    assert message.startswith("cannot open database "), message
    assert len(message) < 500, message
    return message


# What is refused, and why --------------------------------------------------------------------------

REFUSED: list[tuple[str, str]] = [
    ("", "is empty"),
    ("   ", "is empty"),
    ("sqlite:///x.db?foo=bar", "unknown parameter 'foo'"),
    ("x.db?foo=bar", "unknown parameter 'foo'"),
    ("sqlite:///x.db?mode=ro&cache=shared&uri=true", "unknown parameter 'cache'"),
    ("sqlite:///x.db?timeout=5", "unknown parameter 'timeout'"),
    ("x.db?mode=bogus", "mode=bogus is not one of rwc, rw, ro"),
    ("x.db?mode=memory", "mode=memory is not one of"),
    ("x.db?mode=ro&mode=rw", "more than once"),
    ("x.db?uri=false", "uri=false"),
    ("x.db?mode", "cannot read the parameters"),
    ("?mode=ro", "file path is missing"),
    (":memory:?mode=ro", "in-memory"),
    ("sqlite:///x.db?mode=ro", "no database file"),
    ("x.db?mode=ro", "no database file"),
    ("sqlite:///x.db?uri=true&mode=ro", "no database file"),  # SQLAlchemy alone creates 'x.db?mode=ro'
    ("sqlite:///file:x.db?mode=rw&uri=true", "no database file"),
    ("sub/x.db?mode=rw", "no database file"),  # ... and creates no folder either
    ("sqlite:///x%3Fy.db", "cannot contain '?'"),
    (f"{NO_USER}/plans.db", "no user named 'nosuchuser_memplan_test'"),
    (f"sqlite:///{NO_USER}/plans.db", "no user named 'nosuchuser_memplan_test'"),
    ("newdir/", "names a folder"),
    ("a" * 700 + ".db", "is 703 bytes long; a database file name has at most 247"),
    ("x" * 248, "is 248 bytes long"),
    ("d" * 256 + "/plans.db", "folder name 'ddd"),
    ("b" * 6000, "is 6000 bytes long"),
    ("sub/" + "é" * 200 + ".db", "is 403 bytes long"),  # 203 characters, but bytes count
    ("sqlite:///" + "c" * 300, "is 300 bytes long"),
    ("a\nb.db", "control character '\\n'"),
    ("a\x00b.db", "control character '\\x00'"),
    ("a\udcffb.db", "not valid UTF-8"),  # what Python makes of a Latin-1 file name on the command line
    ("sqlite://host/plans.db", "names no host"),
    ("sqlite://user@/plans.db", "names no host"),
    ("sqlite:///file://host/x.db?uri=true", "names no host"),
    ("sqlite://:notaport/x.db", "not a database URL"),
    ("nosuchdb://host/db", "nosuchdb"),
]


@pytest.mark.parametrize(("url", "reason"), REFUSED, ids=[repr(url[:40]) for url, _ in REFUSED])
def test_a_bad_url_or_path_is_one_line_and_creates_nothing(workdir: Path, url: str, reason: str) -> None:
    message = one_line_error(url)
    assert reason in message, message
    assert everything_under(workdir) == []


def test_a_path_too_long_for_sqlite_is_refused_before_any_folder_is_made(workdir: Path) -> None:
    too_long = nested_path(MAX_SQLITE_PATH_BYTES + 100)
    message = one_line_error(too_long)
    assert f"SQLite opens paths of at most {MAX_SQLITE_PATH_BYTES} bytes" in message
    assert everything_under(workdir) == []


def test_a_password_in_an_unparseable_url_is_hidden(workdir: Path) -> None:
    message = one_line_error("postgresql://user:secret@host:notaport/plans")
    assert "secret" not in message and "user:***@host" in message


def test_an_empty_planner_db_means_unset_and_a_bad_one_is_named(
    workdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    for blank in ("", "  "):
        monkeypatch.setenv("PLANNER_DB", blank)
        with open_storage() as storage:  # the default file in the user data folder
            assert storage.url.endswith("/memplan/memplan.db")
    monkeypatch.setenv("PLANNER_DB", f"{NO_USER}/plans.db")
    with pytest.raises(
        InputError, match=r"^cannot open database ~nosuchuser_memplan_test/plans.db \(from \$PLANNER_DB\)"
    ):
        open_storage()
    monkeypatch.setenv("PLANNER_DB", "x.db?foo=bar")
    with pytest.raises(InputError, match=r"\(from \$PLANNER_DB\): unknown parameter 'foo'"):
        open_storage()
    assert everything_under(workdir) == []


def test_a_first_open_that_fails_midway_leaves_no_file_and_no_folder(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing_schema(engine: Engine, read_only: bool = False) -> None:
        with engine.connect() as conn:  # SQLite has created the (empty) file by now
            conn.exec_driver_sql("SELECT 1")
        raise OperationalError("BEGIN IMMEDIATE", {}, sqlite3.OperationalError("disk I/O error"))

    monkeypatch.setattr(backend, "ensure_schema", failing_schema)
    assert "disk I/O error" in one_line_error("new/sub/plans.db")
    assert everything_under(workdir) == []
    (workdir / "kept").mkdir()  # folders and files that were there before stay
    (workdir / "kept" / "plans.db").touch()
    assert "disk I/O error" in one_line_error("kept/plans.db")
    assert everything_under(workdir) == ["kept", "kept/plans.db"]


def test_a_path_object_is_a_path_and_other_objects_are_refused(workdir: Path) -> None:
    with open_storage(workdir / "plans.db") as storage:  # type: ignore[arg-type]
        storage.save_plan(**plan())
    assert "give a SQLite file path or a database URL" in one_line_error(42)  # type: ignore[arg-type]


# What works -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("url", [":memory:", "sqlite://", "sqlite:///:memory:", "sqlite://:memory:"])
def test_every_spelling_of_in_memory_is_a_private_database_in_memory(workdir: Path, url: str) -> None:
    with open_storage(url) as storage:
        saved = storage.save_plan(**plan())
        assert storage.list_plans() == [saved]
        assert storage.url == "sqlite:///:memory:"
    with open_storage(url) as storage:  # each storage has its own
        assert storage.list_plans() == []
    assert everything_under(workdir) == []


@pytest.mark.parametrize(
    "name",
    ["plans.db", "plän ünï 計画.db", "a b#c%41&d=e.db", "é" * 120 + ".db"],
    ids=["ascii", "unicode", "odd", "long"],
)
@pytest.mark.parametrize("form", ["path", "url", "file-uri"])
def test_read_only_and_must_exist_modes_open_an_existing_file(workdir: Path, name: str, form: str) -> None:
    with open_storage(name) as storage:
        saved = storage.save_plan(**plan())
    before = (workdir / name).read_bytes()

    def spelled(mode: str) -> str:
        if form == "path":
            return f"{name}?mode={mode}"
        if form == "url":
            return f"sqlite:///{name.replace('%', '%25').replace('#', '%23')}?mode={mode}"
        return f"sqlite:///file:{name.replace('%', '%2525').replace('#', '%2523')}?mode={mode}&uri=true"

    with open_storage(spelled("ro")) as storage:
        assert storage.list_plans() == [saved]
        assert storage.url.endswith("?mode=ro")
        with pytest.raises(InputError, match="^cannot use database .*readonly"):
            storage.save_plan(**plan())
    assert (workdir / name).read_bytes() == before
    with open_storage(spelled("rw")) as storage:
        storage.save_plan(**plan())
        assert len(storage.list_plans()) == 2
    assert everything_under(workdir) == [name]  # no journal left, no file with '?' in its name


def test_read_only_refuses_a_database_it_would_have_to_upgrade(workdir: Path) -> None:
    config = alembic_config()
    config.set_main_option("sqlalchemy.url", f"sqlite:///{workdir / 'old.db'}")
    command.upgrade(config, "0001")
    before = (workdir / "old.db").read_bytes()
    message = one_line_error("old.db?mode=ro")
    assert "older schema '0001'" in message and "without mode=ro" in message
    assert (workdir / "old.db").read_bytes() == before
    (workdir / "empty.db").touch()
    assert "has no memplan tables yet" in one_line_error("empty.db?mode=ro")
    assert (workdir / "empty.db").read_bytes() == b""
    with open_storage("old.db?mode=rw") as storage:  # rw may upgrade it
        assert storage.list_plans() == []
    with sqlite3.connect(workdir / "old.db") as conn:
        assert conn.execute("SELECT version_num FROM memplan_alembic_version").fetchall() == [(HEAD_REVISION,)]


def test_long_and_unicode_paths_within_the_limits_work(workdir: Path) -> None:
    long_path = nested_path(MAX_SQLITE_PATH_BYTES)
    assert len(str(Path(long_path).resolve()).encode()) == MAX_SQLITE_PATH_BYTES
    longest_name = "ü" * 121 + "xy.db"
    assert len(longest_name.encode()) == MAX_FILE_NAME_BYTES
    for url in (long_path, longest_name, f"sqlite:///{NO_USER[1:]}/plans.db"):
        with open_storage(url) as storage:
            saved = storage.save_plan(**plan())
        with open_storage(url) as storage:
            assert storage.list_plans() == [saved]


def test_a_tilde_is_expanded_in_paths_and_in_sqlite_urls(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(workdir / "home"))
    for url in ("~/a.db", "sqlite:///~/b.db"):
        with open_storage(url) as storage:
            storage.save_plan(**plan())
    assert everything_under(workdir / "home") == ["a.db", "b.db"]


# Through the command line ------------------------------------------------------------------------------


def run_planner(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m planner ARGS`` in ``cwd`` with a private user data folder."""
    environment = {k: v for k, v in os.environ.items() if k != "PLANNER_DB"}
    environment |= {"PYTHONPATH": str(REPO), "XDG_DATA_HOME": str(cwd.parent / "xdg"), "DS_ACCELERATOR": "cpu"}
    environment |= env
    return subprocess.run(
        [sys.executable, "-m", "planner", *args], cwd=cwd, env=environment, capture_output=True, text=True, timeout=120
    )


CLI_REFUSED = [
    ("plans", "sqlite:///x.db?foo=bar", "unknown parameter 'foo'"),
    ("plans", "sqlite:///x.db?mode=ro", "no database file"),
    ("probes", "x.db?mode=ro", "no database file"),
    ("plans", f"{NO_USER}/plans.db", "no user named"),
    ("probes", "", "is empty"),
    ("plans", "z" * 3000, "is 3000 bytes long"),
]


@pytest.mark.parametrize(("command_name", "url", "reason"), CLI_REFUSED, ids=[repr(u[:30]) for _, u, _ in CLI_REFUSED])
def test_the_cli_prints_one_line_exits_2_and_creates_nothing(
    workdir: Path, command_name: str, url: str, reason: str
) -> None:
    done = run_planner_here([command_name, "--db", url])
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("planner: error: cannot open database "), done.stderr
    assert reason in lines[0]
    assert everything_under(workdir) == []


def test_the_cli_names_a_bad_planner_db(workdir: Path) -> None:
    done = run_planner(["plans"], workdir, PLANNER_DB=f"{NO_USER}/plans.db")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"planner: error: cannot open database {NO_USER}/plans.db (from $PLANNER_DB): there is no user named"
        f" '{NO_USER[1:]}' to expand '{NO_USER}'"
    ]
    assert everything_under(workdir) == []


@pytest.mark.parametrize("command_name", ["plans", "probes"])
def test_the_cli_opens_sqlite_colon_memory_as_an_empty_database(workdir: Path, command_name: str) -> None:
    done = run_planner_here([command_name, "--db", "sqlite://:memory:"])
    assert (done.returncode, done.stderr) == (0, "")
    assert "no " in done.stdout  # "no plans saved yet" / "no probes stored yet"
    assert everything_under(workdir) == []
