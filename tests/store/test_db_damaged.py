"""Damaged and foreign databases: one InputError line, never a traceback, and nothing of the user's written over.

Real SQLite files damaged the ways disks and people damage them (a page overwritten, a plan row edited by
hand), files that are not databases at all, and a real PostgreSQL database created with the encoding
``initdb`` picks under the C locale (SQL_ASCII).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

import pytest
from test_db import sft_plan

from store.db import SQLAlchemyStorage, connect_args, open_storage, optuna_storage_url
from store.errors import InputError

PAGE = 4096


def _saved(path: Path, plans: int = 3) -> list[str]:
    with open_storage(str(path)) as storage:
        return [storage.save_plan(**sft_plan()).plan_id for _ in range(plans)]


def _one_line(error: pytest.ExceptionInfo[InputError], *fragments: str) -> str:
    message = str(error.value)
    assert "\n" not in message and "Traceback" not in message, message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


def test_a_damaged_page_is_one_line(tmp_path: Path) -> None:
    db = tmp_path / "plans.db"
    plan_id = _saved(db)[0]
    with sqlite3.connect(db) as conn:
        (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'plans'").fetchone()
    data = bytearray(db.read_bytes())
    data[(root - 1) * PAGE : root * PAGE] = b"\x17" * PAGE  # the plans table's page, as a bad sector leaves it
    db.write_bytes(bytes(data))
    storage = open_storage(str(db))  # the schema pages are intact: it opens
    try:
        for read in (storage.list_plans, storage.latest_plan, lambda: storage.get_plan(plan_id)):
            with pytest.raises(InputError) as error:
                read()
            _one_line(error, "malformed", str(db))
    finally:
        storage.close()


@pytest.mark.parametrize(
    ("column", "value", "fragment"),
    [
        ("document", "not json at all", "damaged"),
        ("document", "[]", "document is not a JSON object"),
        ("ds_config", "null", "ds_config is not a JSON object"),
        ("workload", '"sft"', "workload is not a JSON object"),
        ("created_at", "yesterday", "damaged"),
    ],
    ids=["document-not-json", "document-list", "ds-config-null", "workload-text", "created-at"],
)
def test_a_plan_row_changed_by_hand_is_one_line(tmp_path: Path, column: str, value: str, fragment: str) -> None:
    db = tmp_path / "plans.db"
    plan_id = _saved(db, plans=1)[0]
    with sqlite3.connect(db) as conn:
        conn.execute(f"UPDATE plans SET {column} = ?", (value,))
    with open_storage(str(db)) as storage:
        for read in (storage.list_plans, storage.latest_plan, lambda: storage.get_plan(plan_id)):
            with pytest.raises(InputError) as error:
                read()
            _one_line(error, fragment)


@pytest.mark.parametrize(
    "content", [b"\x00", b"x", b"my notes\n", os.urandom(5000)], ids=["one-nul", "one-byte", "text", "random"]
)
def test_a_file_that_is_not_a_database_is_refused_and_left_as_it_was(tmp_path: Path, content: bytes) -> None:
    """SQLite writes a new database over a one-byte file; memplan never opens a file without SQLite's header."""
    path = tmp_path / "mine.db"
    path.write_bytes(content)
    with pytest.raises(InputError) as error:
        open_storage(str(path))
    _one_line(error, "not a database")
    assert path.read_bytes() == content


def test_a_fifo_is_refused_without_waiting_on_it(tmp_path: Path) -> None:
    fifo = tmp_path / "plans.db"
    os.mkfifo(fifo)
    outcome: list[BaseException | None] = []

    def open_it() -> None:
        try:
            open_storage(str(fifo)).close()
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            outcome.append(exc)

    thread = threading.Thread(target=open_it, daemon=True)
    thread.start()
    thread.join(30)
    assert outcome, "opening a FIFO as the database blocks"
    assert isinstance(outcome[0], InputError) and "not a regular file" in str(outcome[0]), outcome


def test_a_sql_ascii_postgresql_database_holds_plans_and_a_study(sql_ascii_url: str) -> None:
    import optuna

    plan = sft_plan()
    plan["document"] = {**plan["document"], "note": "réglé à 24 Go"}  # text beyond ASCII comes back as it was
    storage = SQLAlchemyStorage(sql_ascii_url)
    try:
        saved = storage.save_plan(**plan)
        assert storage.get_plan(saved.plan_id).document["note"] == "réglé à 24 Go"
        assert [p.plan_id for p in storage.list_plans()] == [saved.plan_id]
    finally:
        storage.close()
    url = optuna_storage_url(sql_ascii_url)
    rdb = optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": connect_args(url)})
    study = optuna.create_study(study_name="é-study", storage=rdb, load_if_exists=True)
    study.set_user_attr("candidates", ["a", "b"])
    assert optuna.load_study(study_name="é-study", storage=rdb).user_attrs["candidates"] == ["a", "b"]
    rdb.engine.dispose()
