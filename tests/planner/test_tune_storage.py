"""``planner tune`` keeps its Optuna study beside the plans: a study table from another Optuna version is one
line, and a PostgreSQL database created under the C locale (encoding SQL_ASCII) holds a study as any other."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from planner_helpers import assert_one_error_line, run_main

from store.db import open_storage, optuna_storage_url

JOB = ("--model", "opt-125m", "--gpu-mem", "24G", "--cpu-mem", "64G", "--workload", "sft", "--device", "cpu")


def _no_probe(*_args: Any, **_kwargs: Any) -> Any:
    raise AssertionError("the tune ran a probe although its study cannot be opened")


@pytest.mark.parametrize("version", ["v1.2.0.a", "from-the-future"], ids=["older", "unknown"])
def test_an_optuna_schema_of_another_version_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    import optuna

    monkeypatch.setattr("probes.run_probe", _no_probe)
    monkeypatch.setattr("probes.prepare_ops", _no_probe)
    db = tmp_path / "plans.db"
    open_storage(str(db)).close()
    optuna.create_study(storage=optuna.storages.RDBStorage(optuna_storage_url(str(db))), study_name="other")
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE alembic_version SET version_num = ?", (version,))
    before = db.read_bytes()
    line = assert_one_error_line(run_main(["tune", *JOB, "--db", db]), "Optuna")
    assert str(db) in line and "optuna" in line.lower()
    assert db.read_bytes() == before


def test_a_tune_study_opens_on_a_sql_ascii_database(sql_ascii_url: str) -> None:
    from planner.tuning.study import open_study

    open_storage(sql_ascii_url).close()
    study = open_study(optuna_storage_url(sql_ascii_url), "memplan-tune-é", ["ZeRO-1 é", "ZeRO-2"])
    assert study.user_attrs["candidates"] == ["ZeRO-1 é", "ZeRO-2"]
    again = open_study(optuna_storage_url(sql_ascii_url), "memplan-tune-é", ["other"])
    assert again.user_attrs["candidates"] == ["ZeRO-1 é", "ZeRO-2"]  # a resumed study keeps its candidates


def test_an_optuna_version_table_alone_is_refused_before_optuna_creates_its_tables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Optuna's RDB storage creates its 11 tables before it checks their version: a database holding only an
    ``alembic_version`` of another revision got them, then the refusal (issue 43). Refused first now."""
    monkeypatch.setattr("probes.run_probe", _no_probe)
    monkeypatch.setattr("probes.prepare_ops", _no_probe)
    db = tmp_path / "plans.db"
    open_storage(str(db)).close()
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
        conn.execute("INSERT INTO alembic_version VALUES ('v1.2.0.a')")
    before = db.read_bytes()
    line = assert_one_error_line(run_main(["tune", *JOB, "--db", db]), "v1.2.0.a")
    assert str(db) in line
    assert db.read_bytes() == before
    with sqlite3.connect(db) as conn:
        assert not conn.execute("SELECT name FROM sqlite_master WHERE name = 'trials'").fetchall()
