"""Old databases upgrade (issue 13): a database file written at an older schema, committed under
``tests/data/``, opens with the current store, keeps its rows and gains what the newer schema adds.

``tests/data/memplan_0001.sqlite3`` is a database at migration 0001 (plans only, before the probe tables
of 0002) holding the two plans in ``PLANS_0001``, written as the 0001-era store wrote them (through
the ``plans`` ORM row, which 0002 left unchanged). It was made once by running this file::

    .venv/bin/python tests/store/test_db_upgrade_assets.py

and is never rewritten by the tests (they open a copy): it stands for a file a user made long ago.
(Its suffix is ``.sqlite3`` because ``.gitignore`` ignores ``*.db``.)
When a later migration changes ``plans``, keep this file as it is and add the next one beside it.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine

from store.db import PlanRecord, open_storage
from store.db._orm import Base
from store.db._schema import HEAD_REVISION, LEGACY_VERSION_TABLE, VERSION_TABLE
from store.measurements import PhaseMeasurement, ProbeRequest, ProbeResult

# compare_metadata must know the store's version table to leave it out of the comparison.
VERSION_OPTS = {"version_table": VERSION_TABLE}

REPO = Path(__file__).resolve().parents[2]
FIXTURE_0001 = REPO / "tests" / "data" / "memplan_0001.sqlite3"

PLANS_0001: list[dict[str, Any]] = [
    {
        "plan_id": "a1b2c3d4e5f6",
        "created_at": datetime(2024, 11, 25, 9, 30, 0, 123456, tzinfo=timezone.utc),
        "kind": "sft",
        "model": "opt-1.3b",
        "fits": True,
        "workload": {"kind": "sft", "model": "opt-1.3b", "batch": 8, "seq_len": 512, "dtype": "bf16"},
        "hardware": {"gpu": "RTX-4090", "gpu_memory_bytes": 25_769_803_776, "gpus": 1, "nodes": 1},
        "strategy": {"zero_stage": 2, "gradient_checkpointing": True, "micro_batch": 4, "grad_accum": 2},
        "predicted": {
            "peak_allocated_bytes": 17_179_869_184,
            "peak_reserved_bytes": 19_327_352_832,
            "step_time_s": 0.75,
        },
        "ds_config": {"train_batch_size": 8, "zero_optimization": {"stage": 2}, "bf16": {"enabled": True}},
        "document": {"plan_id": "a1b2c3d4e5f6", "fits": True, "note": "Größe passt"},
    },
    {
        "plan_id": "0f1e2d3c4b5a",
        "created_at": datetime(2024, 11, 26, 17, 5, 42, tzinfo=timezone.utc),
        "kind": "ppo",
        "model": "llama-3-8b",
        "fits": False,
        "workload": {"kind": "ppo", "model": "llama-3-8b", "batch": 16, "prompt_len": 256, "gen_len": 256},
        "hardware": {"gpu": "A100-80G", "gpu_memory_bytes": 85_899_345_920, "gpus": 8, "nodes": 1},
        "strategy": {"actor": {"zero_stage": 3, "lora_rank": 0}, "empty_cache": "after-generation"},
        "predicted": {"peak_allocated_bytes": 96_636_764_160, "phases": [{"name": "generation", "time_s": 1.5}]},
        "ds_config": {"actor": {"zero_optimization": {"stage": 3}}, "critic": {"zero_optimization": {"stage": 3}}},
        "document": {"plan_id": "0f1e2d3c4b5a", "fits": False, "alternatives": []},
    },
]


def copy_of_fixture(tmp_path: Path) -> Path:
    """A copy of the 0001 database that a test may change."""
    copy = tmp_path / "old.db"
    shutil.copyfile(FIXTURE_0001, copy)
    return copy


def tables_and_version(path: Path, version_table: str = VERSION_TABLE) -> tuple[set[str], list[str]]:
    """The table names of ``path`` and the rows of its version table, read with sqlite3 (the store's
    ``memplan_alembic_version``; ``alembic_version`` in a file from before the rename)."""
    conn = sqlite3.connect(path)
    try:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        versions = [row[0] for row in conn.execute(f"SELECT version_num FROM {version_table}")]
        return tables, versions
    finally:
        conn.close()


def expected_records() -> list[PlanRecord]:
    """``PLANS_0001`` as the store returns them, newest first."""
    records = [PlanRecord(**{k: v for k, v in plan.items()}) for plan in PLANS_0001]
    return sorted(records, key=lambda record: record.created_at, reverse=True)


def test_the_committed_fixture_is_a_0001_database_with_two_plans() -> None:
    assert FIXTURE_0001.stat().st_size < 32 * 1024
    tables, versions = tables_and_version(FIXTURE_0001, LEGACY_VERSION_TABLE)
    assert (tables, versions) == ({"alembic_version", "plans"}, ["0001"])
    conn = sqlite3.connect(f"file:{FIXTURE_0001}?mode=ro", uri=True)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        rows = conn.execute("SELECT plan_id, created_at, fits FROM plans ORDER BY id").fetchall()
    finally:
        conn.close()
    assert rows == [
        ("a1b2c3d4e5f6", "2024-11-25 09:30:00.123456", 1),
        ("0f1e2d3c4b5a", "2024-11-26 17:05:42.000000", 0),
    ]


def test_a_0001_database_upgrades_on_open_and_keeps_its_plans(tmp_path: Path) -> None:
    old = copy_of_fixture(tmp_path)
    with open_storage(str(old)) as storage:
        assert storage.list_plans() == expected_records()
        assert storage.get_plan("0f1e") == expected_records()[0]
        assert storage.latest_plan() == expected_records()[0]
        assert storage.list_plans(kind="sft") == expected_records()[1:]
    tables, versions = tables_and_version(old)
    assert versions == [HEAD_REVISION]
    assert {"plans", "probes", "probe_runs"} <= tables
    assert LEGACY_VERSION_TABLE not in tables  # the revision moved to the store's own version table
    engine = create_engine(f"sqlite:///{old}")
    try:
        with engine.connect() as conn:  # upgraded to exactly what the current ORM describes
            assert compare_metadata(MigrationContext.configure(conn, opts=VERSION_OPTS), Base.metadata) == []
    finally:
        engine.dispose()
    assert FIXTURE_0001.read_bytes() != old.read_bytes()


def test_an_upgraded_0001_database_stores_probes_and_new_plans(tmp_path: Path) -> None:
    old = copy_of_fixture(tmp_path)
    request = ProbeRequest(workload={"kind": "sft", "model": "opt-1.3b"}, strategy={"zero_stage": 2}, hardware={})
    result = ProbeResult("ok", phases=(PhaseMeasurement("forward", 1024, 2048, 0.25),))
    with open_storage(str(old)) as storage:
        run = storage.start_run(["k1"], {"steps": 3})
        probe = storage.save_probe(request, result, key="k1", run_id=run.run_id)
        plan = storage.save_plan(**{k: v for k, v in PLANS_0001[0].items() if k not in ("plan_id", "created_at")})
    with open_storage(str(old)) as storage:  # reopened: nothing to migrate, all there
        assert storage.find_probe("k1") == probe
        assert storage.get_run(run.run_id).done_keys == ("k1",)
        assert storage.list_plans() == [plan, *expected_records()]


def test_the_cli_lists_the_plans_of_a_0001_database(tmp_path: Path) -> None:
    old = copy_of_fixture(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "planner", "plans", "--db", str(old)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "DS_ACCELERATOR": "cpu", "HOME": str(tmp_path)},
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert "a1b2c3d4e5f6" in done.stdout and "0f1e2d3c4b5a" in done.stdout
    assert tables_and_version(old)[1] == [HEAD_REVISION]


def build_fixture(path: Path) -> None:
    """Write the 0001 database: migration 0001 on a new file, then ``PLANS_0001`` through the ORM row."""
    from alembic import command
    from sqlalchemy.orm import Session

    from store.db._orm import PlanRow
    from store.db._schema import alembic_config

    if path.exists():
        raise SystemExit(f"{path} exists: the fixture is never rewritten (see the module docstring)")
    config = alembic_config()
    config.set_main_option("sqlalchemy.url", f"sqlite:///{path}")
    command.upgrade(config, "0001")
    engine = create_engine(f"sqlite:///{path}")
    try:
        with Session(engine) as session, session.begin():
            session.add_all(PlanRow(**plan) for plan in PLANS_0001)
    finally:
        engine.dispose()
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA page_size = 1024")  # small pages: a file of a few KB
        conn.execute("VACUUM")
    finally:
        conn.close()


if __name__ == "__main__":
    build_fixture(FIXTURE_0001)
    print(f"wrote {FIXTURE_0001} ({FIXTURE_0001.stat().st_size} bytes)")
