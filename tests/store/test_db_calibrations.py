"""Calibrations in the storage contract: saved with their probes and report, found by target, on a real database."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from test_db_probes import assert_schema_is_the_orm, key_of, probe_request, probe_result, stored_versions

from store.db import BaseStorage, SQLAlchemyStorage
from store.db._schema import HEAD_REVISION, alembic_config
from store.errors import InputError

Opener = Callable[[], BaseStorage]  # reopens the database under test (conftest.py)


def _save(storage: BaseStorage, **changes: Any) -> Any:
    fields: dict[str, Any] = {
        "target": "H100-80G",
        "device": "cuda",
        "version": 1,
        "fingerprint": {"name": "NVIDIA H100 80GB HBM3", "total_memory_bytes": 85017493504},
        "values": {"gpu.matmul_efficiency": 0.68, "host_s_per_kernel": 4.2e-5},
        "probe_ids": ["0123456789ab", "ba9876543210"],
        "report": {"errors": {"held_out": {"time": {"count": 2, "median_abs": 0.1, "worst": 0.2}}}},
    }
    fields.update(changes)
    return storage.save_calibration(**fields)


def test_a_saved_calibration_comes_back_after_reopening(storage: BaseStorage, reopen: Opener) -> None:
    saved = _save(storage)
    assert len(saved.calibration_id) == 12 and saved.created_at.tzinfo is not None
    with reopen() as again:
        loaded = again.get_calibration(saved.calibration_id)
    assert loaded == saved
    assert loaded.values == {"gpu.matmul_efficiency": 0.68, "host_s_per_kernel": 4.2e-5}
    assert loaded.probe_ids == ("0123456789ab", "ba9876543210")


def test_latest_is_the_newest_of_its_target_and_version(storage: BaseStorage) -> None:
    first = _save(storage)
    other = _save(storage, target="A100-80G")
    second = _save(storage, values={"host_s_per_kernel": 5e-5})
    old_version = _save(storage, version=7)
    assert storage.latest_calibration("H100-80G", 1) == second
    assert storage.latest_calibration("H100-80G") == old_version  # any version: the newest
    assert storage.latest_calibration("A100-80G") == other
    assert storage.latest_calibration("L4") is None
    listed = storage.list_calibrations()
    assert [c.calibration_id for c in listed] == [
        c.calibration_id for c in (old_version, second, other, first)
    ]  # newest first, history kept
    assert [c.calibration_id for c in storage.list_calibrations(limit=1, target="A100-80G")] == [other.calibration_id]


def test_prefix_lookup_and_its_one_line_errors(storage: BaseStorage) -> None:
    saved = _save(storage)
    assert storage.get_calibration(saved.calibration_id[:6].upper()) == saved
    with pytest.raises(InputError, match="too short"):
        storage.get_calibration("ab")
    with pytest.raises(InputError, match="no calibration has an id starting with"):
        storage.get_calibration("ffffffff" if not saved.calibration_id.startswith("ffff") else "00000000")
    with pytest.raises(InputError, match="whole number >= 1"):
        storage.list_calibrations(limit=0)


def test_a_returned_record_is_a_copy(storage: BaseStorage) -> None:
    saved = _save(storage)
    saved.values["host_s_per_kernel"] = 1.0
    saved.report["errors"] = {}
    again = storage.get_calibration(saved.calibration_id)
    assert again.values["host_s_per_kernel"] == 4.2e-5 and again.report["errors"]


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"target": ""}, "target"),
        ({"device": "tpu"}, "device"),
        ({"version": 0}, "version"),
        ({"values": {"x": float("nan")}}, "finite numbers"),
        ({"values": {"x": "fast"}}, "finite numbers"),
        ({"probe_ids": [""]}, "probe_ids"),
        ({"report": {"x": object()}}, "report"),
    ],
)
def test_a_malformed_calibration_is_refused_and_nothing_is_written(
    storage: BaseStorage, changes: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(TypeError, match=fragment):
        _save(storage, **changes)
    assert storage.list_calibrations() == []


def test_a_0004_database_gains_the_calibrations_table_and_keeps_its_probes(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    url = f"sqlite:///{path}"
    with SQLAlchemyStorage(url) as storage:
        kept = storage.save_probe(probe_request(), probe_result(), key=key_of(probe_request()))
    config = alembic_config()
    config.set_main_option("sqlalchemy.url", url)
    command.downgrade(config, "0004")  # what memplan built before calibrations existed
    with sqlite3.connect(path) as conn:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "calibrations" not in tables and stored_versions(path) == ["0004"]

    with SQLAlchemyStorage(url) as storage:
        assert storage.get_probe(kept.probe_id) == kept
        assert storage.latest_calibration("H100-80G") is None
        saved = _save(storage)
        assert storage.latest_calibration("H100-80G") == saved
    assert stored_versions(path) == [HEAD_REVISION]
    assert_schema_is_the_orm(url)
