"""Probes and probe runs in the storage contract (store.db.BaseStorage), against every backend on a
real database, plus the schema migration that added them (0001 plans -> 0002 probes).

To check a new backend, add a factory to ``BACKENDS`` in conftest.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sqlite3
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect, text

from store.db import BaseStorage, ProbeRecord, ProbeRunRecord, SQLAlchemyStorage
from store.db._orm import Base
from store.db._schema import HEAD_REVISION, MIGRATIONS_DIR, VERSION_TABLE, alembic_config
from store.errors import InputError
from store.measurements import DeviceFingerprint, PhaseMeasurement, ProbeRequest, ProbeResult

# compare_metadata must know the store's version table to leave it out of the comparison.
VERSION_OPTS = {"version_table": VERSION_TABLE}

REPO = Path(__file__).resolve().parents[2]
VERSIONS = {"torch": "2.4.1", "deepspeed": "0.15.1", "transformers": "4.44.2"}

Opener = Callable[[], BaseStorage]  # reopens the database under test (conftest.py)


def probe_request(kind: str = "sft", model: str = "opt-1.3b", device: str = "cuda", **overrides: Any) -> ProbeRequest:
    """A realistic request: a workload, a strategy and the hardware, cut to two layers."""
    fields: dict[str, Any] = {
        "workload": {"kind": kind, "model": model, "batch": 8, "seq_len": 512, "dtype": "bf16"},
        "strategy": {
            "zero_stage": 2,
            "offload_optimizer": "none",
            "offload_param": "none",
            "gradient_checkpointing": True,
            "lora_rank": 0,
            "micro_batch": 4,
            "grad_accum": 2,
            "empty_cache": "never",
            "allocator": "expandable-segments",
        },
        "hardware": {"gpu": "H100-80G", "gpu_memory_bytes": 80 * 2**30, "gpus": 1, "nodes": 1},
        "device": device,
        "steps": 4,
        "layers": 2,
        "timeout_s": 300.0,
        "memory_cap_bytes": None,
    }
    fields.update(overrides)
    return ProbeRequest(**fields)


FINGERPRINT = DeviceFingerprint(
    device="cuda",
    name="NVIDIA H100 80GB HBM3",
    total_memory_bytes=85_045_641_216,
    compute_capability="9.0",
    driver="550.54.15",
    cuda="12.4",
    **VERSIONS,
)


def probe_result(outcome: str = "ok", **overrides: Any) -> ProbeResult:
    """A result with three measured phases, a fingerprint and some extras."""
    fields: dict[str, Any] = {
        "outcome": outcome,
        "phases": (
            PhaseMeasurement("forward", 5_368_709_120, 6_442_450_944, 0.0625, inactive_split_bytes=1_048_576),
            PhaseMeasurement("backward", 9_663_676_416, 10_737_418_240, 0.125, alloc_retries=1),
            PhaseMeasurement("optimizer_step", 7_516_192_768, 10_737_418_240, 0.03125),
        ),
        "failed_phase": None,
        "message": "",
        "host_rss_peak_bytes": 12_884_901_888,
        "wall_s": 42.5,
        "fingerprint": FINGERPRINT,
        "layers": 2,
        "extra": {"allocator_settings": "expandable_segments:True", "ranks": [0]},
    }
    fields.update(overrides)
    return ProbeResult(**fields)


def oom_result() -> ProbeResult:
    """An out-of-memory result that stopped in the backward phase."""
    return probe_result(
        "oom",
        phases=(PhaseMeasurement("forward", 70 * 2**30, 75 * 2**30, 0.5, num_ooms=0),),
        failed_phase="backward",
        message="CUDA out of memory. Tried to allocate 2.00 GiB",
    )


def key_of(request: ProbeRequest) -> str:
    """The canonical key a caller stores ``request`` under."""
    return request.key(VERSIONS)


def save(storage: BaseStorage, request: ProbeRequest | None = None, **kwargs: Any) -> ProbeRecord:
    """Save a probe of ``request`` (default: the realistic one) with an ok result unless one is given."""
    request = request or probe_request()
    result = kwargs.pop("result", None) or probe_result()
    key = kwargs.pop("key") if "key" in kwargs else key_of(request)
    return storage.save_probe(request, result, key=key, **kwargs)


# Probes ------------------------------------------------------------------------------------------


def test_save_then_find_round_trips_every_field(storage: BaseStorage) -> None:
    request, result = probe_request(), probe_result()
    key = key_of(request)
    before = datetime.now(timezone.utc)
    saved = storage.save_probe(request, result, key=key)
    after = datetime.now(timezone.utc)

    assert isinstance(saved, ProbeRecord)
    assert re.fullmatch(r"[0-9a-f]{12}", saved.probe_id)
    assert saved.key == key and re.fullmatch(r"[0-9a-f]{64}", key)
    assert saved.run_id is None
    assert saved.created_at.tzinfo is not None and saved.created_at.utcoffset() == timedelta(0)
    assert before - timedelta(seconds=1) <= saved.created_at <= after + timedelta(seconds=1)
    assert (saved.kind, saved.model, saved.device, saved.outcome) == ("sft", "opt-1.3b", "cuda", "ok")
    assert saved.request == request
    assert saved.result == result
    assert saved.result.fingerprint == FINGERPRINT
    assert saved.result.phases[1] == result.phases[1] and saved.result.phases[1].alloc_retries == 1
    assert saved.result.peak_allocated_bytes == 9_663_676_416
    assert saved.result.step_time_s == pytest.approx(0.21875)

    assert storage.find_probe(key) == saved
    assert storage.get_probe(saved.probe_id) == saved


def test_a_failed_probe_without_fingerprint_round_trips(storage: BaseStorage) -> None:
    request = probe_request(device="cpu", memory_cap_bytes=2 * 2**30, layers=None, timeout_s=5.0)
    result = ProbeResult(outcome="timeout", failed_phase="forward", message="no step within 5.0 s", wall_s=5.25)
    saved = save(storage, request, result=result)
    assert (saved.outcome, saved.device) == ("timeout", "cpu")
    assert saved.request == request and saved.result == result
    assert saved.result.fingerprint is None and saved.result.phases == ()
    assert storage.find_probe(key_of(request)) == saved


def as_json(value: Any) -> Any:
    """A JSON column's value read with plain SQL: text from SQLite, already decoded from PostgreSQL."""
    return json.loads(value) if isinstance(value, str) else value


def test_the_searchable_columns_hold_the_results_numbers(storage: BaseStorage) -> None:
    saved = save(storage, result=oom_result(), run_id=storage.start_run(["k"], {}).run_id)
    assert isinstance(storage, SQLAlchemyStorage)
    engine = create_engine(storage._url)  # a connection of its own, with plain SQL: what the columns hold
    try:
        with engine.connect() as conn:
            query = text("SELECT * FROM probes WHERE probe_id = :probe_id")
            row = conn.execute(query, {"probe_id": saved.probe_id}).mappings().one()
    finally:
        engine.dispose()
    assert row["key"] == saved.key and row["run_id"] == saved.run_id
    assert (row["kind"], row["model"], row["device"], row["outcome"]) == ("sft", "opt-1.3b", "cuda", "oom")
    assert row["failed_phase"] == "backward" and row["message"].startswith("CUDA out of memory")
    assert row["peak_allocated_bytes"] == 70 * 2**30 and row["peak_reserved_bytes"] == 75 * 2**30
    assert row["step_time_s"] == 0.5 and row["wall_s"] == 42.5
    assert as_json(row["fingerprint"]) == FINGERPRINT.to_dict()
    assert as_json(row["result"]) == oom_result().to_dict()
    assert as_json(row["request"]) == probe_request().to_dict()


def test_an_unknown_key_finds_nothing(storage: BaseStorage) -> None:
    assert storage.find_probe("0" * 64) is None
    save(storage)
    assert storage.find_probe("0" * 64) is None


@pytest.mark.parametrize("outcome", ["ok", "oom", "error", "timeout"])
def test_every_outcome_is_final(storage: BaseStorage, outcome: str) -> None:
    saved = save(storage, result=probe_result(outcome, failed_phase=None if outcome == "ok" else "forward"))
    assert storage.find_probe(saved.key) == saved


def test_a_newer_probe_with_the_same_key_wins_and_history_is_kept(storage: BaseStorage) -> None:
    first = save(storage, result=oom_result())
    other = save(storage, probe_request(model="opt-350m"))
    second = save(storage, result=probe_result(wall_s=40.0))
    assert first.key == second.key != other.key
    assert storage.find_probe(first.key) == second
    assert storage.find_probe(other.key) == other
    assert storage.list_probes() == [second, other, first]
    assert storage.get_probe(first.probe_id) == first  # the older one is still there


def test_list_probes_newest_first_with_limit_and_filters(storage: BaseStorage) -> None:
    assert storage.list_probes() == []
    saved = []
    for i in range(60):
        kind, model = ("ppo", "opt-350m") if i % 3 == 0 else ("sft", "opt-1.3b")
        saved.append(save(storage, probe_request(kind, model, "cpu" if i % 2 else "cuda", steps=i)))
    newest_first = saved[::-1]

    assert storage.list_probes() == newest_first[:50]
    assert storage.list_probes(limit=5) == newest_first[:5]
    assert storage.list_probes(limit=100) == newest_first
    assert storage.list_probes(limit=100, kind="ppo") == [p for p in newest_first if p.kind == "ppo"]
    assert storage.list_probes(limit=100, model="opt-1.3b") == [p for p in newest_first if p.model == "opt-1.3b"]
    assert storage.list_probes(limit=100, device="cpu") == [p for p in newest_first if p.device == "cpu"]
    both = [p for p in newest_first if p.kind == "sft" and p.device == "cuda"]
    assert storage.list_probes(limit=3, kind="sft", device="cuda") == both[:3]
    assert storage.list_probes(kind="ppo", model="opt-1.3b") == []
    assert storage.list_probes(device="rocm") == []
    times = [p.created_at for p in storage.list_probes(limit=100)]
    assert times == sorted(times, reverse=True)


@pytest.mark.parametrize("limit", [0, -1, True])
def test_list_probes_rejects_a_limit_below_one(storage: BaseStorage, limit: int) -> None:
    with pytest.raises(InputError, match=">= 1"):
        storage.list_probes(limit=limit)


def test_get_probe_by_prefix(storage: BaseStorage) -> None:
    saved = save(storage)
    assert storage.get_probe(saved.probe_id[:4]) == saved
    assert storage.get_probe(f"  {saved.probe_id[:6].upper()}\n") == saved


@pytest.mark.parametrize("wanted", ["ffff0000ffff", "zzzz", "ab%_"])
def test_get_probe_unknown_or_too_short_is_input_error(storage: BaseStorage, wanted: str) -> None:
    saved = save(storage)
    with pytest.raises(InputError, match="at least 4 characters"):
        storage.get_probe(saved.probe_id[:3])
    with pytest.raises(InputError) as info:
        storage.get_probe(wanted)
    message = str(info.value)
    assert "\n" not in message
    assert "no saved probe" in message and wanted in message and "planner probes" in message


def test_get_probe_ambiguous_prefix_is_input_error(storage: BaseStorage, monkeypatch: pytest.MonkeyPatch) -> None:
    fresh = iter([uuid.UUID("abcd1111" + "0" * 24), uuid.UUID("abcd2222" + "0" * 24)])
    monkeypatch.setattr(uuid, "uuid4", lambda: next(fresh))
    first, second = save(storage), save(storage)
    with pytest.raises(InputError) as info:
        storage.get_probe("abcd")
    message = str(info.value)
    assert "\n" not in message
    assert "ambiguous" in message and first.probe_id in message and second.probe_id in message
    assert storage.get_probe("abcd2") == second


def test_probe_records_are_frozen_and_copies(storage: BaseStorage) -> None:
    request = probe_request()
    saved = save(storage, request)
    with pytest.raises(dataclasses.FrozenInstanceError):
        saved.outcome = "oom"  # type: ignore[misc]
    saved.request.workload["batch"] = 1
    saved.result.extra["ranks"].append(1)
    storage.find_probe(saved.key).request.strategy.clear()  # type: ignore[union-attr]
    got = storage.get_probe(saved.probe_id)
    assert got.request == probe_request() and got.result == probe_result()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"result": probe_result("crashed")}, ValueError, "outcome"),
        ({"result": probe_result(extra={"when": datetime.now()})}, TypeError, "result"),
        ({"result": probe_result(wall_s=float("nan"))}, TypeError, "result"),
        ({"request": probe_request(strategy={"zero_stage": {2}}), "key": "k"}, TypeError, "request"),
        ({"request": probe_request(workload={"model": "opt-1.3b"})}, TypeError, "kind"),
        ({"request": probe_request(workload={"kind": "sft", "model": ""})}, TypeError, "model"),
        ({"key": ""}, TypeError, "key"),
        ({"key": "f" * 65}, TypeError, "key"),
        ({"run_id": "000000000000"}, InputError, "no probe run"),
    ],
    ids=["outcome", "extra", "nan", "request", "no-kind", "empty-model", "empty-key", "long-key", "no-run"],
)
def test_a_failed_probe_save_writes_nothing(
    storage: BaseStorage, kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    save(storage)
    before = storage.list_probes()
    kwargs = dict(kwargs)
    with pytest.raises(error, match=match):
        save(storage, kwargs.pop("request", None), **kwargs)
    assert storage.list_probes() == before


def test_the_request_and_result_must_be_the_measurement_records(storage: BaseStorage) -> None:
    with pytest.raises(TypeError, match="ProbeRequest"):
        storage.save_probe(probe_request().to_dict(), probe_result(), key="k")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ProbeResult"):
        storage.save_probe(probe_request(), probe_result().to_dict(), key="k")  # type: ignore[arg-type]
    assert storage.list_probes() == []


# Probe runs --------------------------------------------------------------------------------------


def test_run_lifecycle_and_resume(storage: BaseStorage) -> None:
    requests = [probe_request(steps=s) for s in (2, 3, 4)]
    keys = [key_of(r) for r in requests]
    options = {"force": False, "layers": 2, "timeout_s": 300.0}

    run = storage.start_run(keys, options)
    assert isinstance(run, ProbeRunRecord)
    assert re.fullmatch(r"[0-9a-f]{12}", run.run_id)
    assert (run.status, run.total, run.request_keys, run.options, run.done_keys) == (
        "running",
        3,
        tuple(keys),
        options,
        (),
    )
    assert run.created_at.utcoffset() == timedelta(0)
    assert storage.unfinished_run(keys) == run

    probe = storage.save_probe(requests[0], probe_result(), key=keys[0], run_id=run.run_id)
    assert probe.run_id == run.run_id
    resumed = storage.unfinished_run(keys)
    assert resumed is not None and resumed.run_id == run.run_id
    assert resumed.done_keys == (keys[0],) and resumed.pending_keys == tuple(keys[1:])
    assert storage.get_run(run.run_id) == resumed

    assert storage.unfinished_run(keys[::-1]) is None  # another order is another command
    assert storage.unfinished_run(keys[:2]) is None
    assert storage.unfinished_run([*keys, keys[0]]) is None

    for request, key in zip(requests[1:], keys[1:], strict=True):
        storage.save_probe(request, oom_result(), key=key, run_id=run.run_id)
    done = storage.finish_run(run.run_id)
    assert done.status == "done" and done.done_keys == tuple(keys) and done.pending_keys == ()
    assert storage.unfinished_run(keys) is None
    assert storage.get_run(run.run_id) == done


def test_an_interrupted_run_is_resumed_and_the_newest_wins(storage: BaseStorage) -> None:
    keys = ["a" * 64, "b" * 64, "c" * 64]
    older = storage.start_run(keys, {"try": 1})
    newer = storage.start_run(keys, {"try": 2})
    storage.start_run(["d" * 64], {})
    assert storage.unfinished_run(keys) == newer

    interrupted = storage.finish_run(newer.run_id, status="interrupted")
    assert interrupted.status == "interrupted"
    assert storage.unfinished_run(keys) == interrupted
    storage.finish_run(newer.run_id)
    assert storage.unfinished_run(keys) == storage.get_run(older.run_id)
    storage.finish_run(older.run_id, "done")
    assert storage.unfinished_run(keys) is None


def test_done_keys_are_each_stored_key_once_in_the_order_stored(storage: BaseStorage) -> None:
    keys = [key_of(probe_request(steps=s)) for s in (2, 3, 4)]
    run = storage.start_run(keys, {})
    for steps in (4, 2, 4):  # the third: a --force rerun of a probe in the same run
        save(storage, probe_request(steps=steps), run_id=run.run_id)
    save(storage, probe_request(steps=3))  # same key, but not part of the run
    got = storage.get_run(run.run_id)
    assert got.done_keys == (keys[2], keys[0]) and got.pending_keys == (keys[1],)
    assert got.total == 3


def test_run_lookup_errors(storage: BaseStorage) -> None:
    run = storage.start_run(["k1", "k2"], {})
    assert storage.get_run(run.run_id[:5].upper()) == run
    with pytest.raises(InputError, match="at least 4 characters"):
        storage.get_run(run.run_id[:2])
    with pytest.raises(InputError, match="no probe run"):
        storage.get_run("zzzzzz")
    with pytest.raises(InputError, match="no probe run"):
        storage.finish_run("000000000000")
    with pytest.raises(ValueError, match="done, interrupted"):
        storage.finish_run(run.run_id, status="running")
    assert storage.get_run(run.run_id).status == "running"


@pytest.mark.parametrize(
    ("keys", "options", "match"),
    [
        ("abc", {}, "request_keys"),
        (["a", 3], {}, "key"),
        (["a", ""], {}, "key"),
        (["a"], {"path": Path("/tmp")}, "options"),
        (["a"], [("force", True)], "options"),
    ],
    ids=["str", "int-key", "empty-key", "path-option", "list-options"],
)
def test_a_bad_run_writes_nothing(storage: BaseStorage, keys: Any, options: Any, match: str) -> None:
    with pytest.raises(TypeError, match=match):
        storage.start_run(keys, options)
    assert storage.unfinished_run(["a"]) is None


def test_an_empty_run_is_allowed(storage: BaseStorage) -> None:
    run = storage.start_run([], {})
    assert (run.total, run.request_keys, run.pending_keys) == (0, (), ())
    assert storage.unfinished_run([]) == run


def test_probes_and_runs_survive_close_and_reopen(reopen: Opener) -> None:
    first = reopen()
    run = first.start_run(["x" * 64, "y" * 64], {"force": True})
    saved = save(first, key="x" * 64, run_id=run.run_id)
    first.close()

    second = reopen()
    assert second.find_probe("x" * 64) == saved
    assert second.list_probes() == [saved]
    resumed = second.unfinished_run(["x" * 64, "y" * 64])
    assert resumed is not None and resumed.done_keys == ("x" * 64,) and resumed.options == {"force": True}


# The schema --------------------------------------------------------------------------------------


def test_head_is_0005_and_matches_the_migration_scripts() -> None:
    assert HEAD_REVISION == "0005"  # 0003 probe artifacts, 0004 the model shape cache, 0005 calibrations
    assert ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head() == HEAD_REVISION


def stored_versions(path: Path) -> list[str]:
    """The rows of memplan_alembic_version, read with the sqlite3 module."""
    with sqlite3.connect(path) as conn:
        return [row[0] for row in conn.execute("SELECT version_num FROM memplan_alembic_version")]


def assert_schema_is_the_orm(url: str) -> None:
    """The database at ``url`` has exactly the tables, columns and indexes of the ORM rows."""
    engine = create_engine(url)
    try:
        tables = set(inspect(engine).get_table_names())
        assert {"plans", "probes", "probe_runs"} <= tables
        indexes = {ix["name"]: ix for ix in inspect(engine).get_indexes("probes")}
        assert indexes["ix_probes_key"]["column_names"] == ["key"] and not indexes["ix_probes_key"]["unique"]
        assert indexes["ix_probes_probe_id"]["unique"]
        with engine.connect() as conn:
            assert compare_metadata(MigrationContext.configure(conn, opts=VERSION_OPTS), Base.metadata) == []
    finally:
        engine.dispose()


def test_a_0001_database_is_upgraded_on_open_and_keeps_its_plans(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    url = f"sqlite:///{path}"
    config = alembic_config()
    config.set_main_option("sqlalchemy.url", url)
    command.upgrade(config, "0001")  # what memplan built before probes existed
    with sqlite3.connect(path) as conn:  # ... and a plan it saved there, as it wrote it
        conn.execute(
            "INSERT INTO plans (plan_id, created_at, kind, model, fits, workload, hardware, strategy, predicted,"
            " ds_config, document) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                "0123456789ab",
                "2024-11-22 10:30:00.000000",
                "sft",
                "opt-1.3b",
                1,
                '{"kind": "sft", "model": "opt-1.3b"}',
                '{"gpus": 1}',
                '{"zero_stage": 1}',
                '{"peak_allocated_bytes": 123}',
                '{"zero_optimization": {"stage": 1}}',
                '{"plan_id": "0123456789ab", "fits": true}',
            ),
        )
        assert "probes" not in {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    assert stored_versions(path) == ["0001"]

    with SQLAlchemyStorage(url) as storage:
        plan = storage.get_plan("0123")
        assert plan.created_at == datetime(2024, 11, 22, 10, 30, tzinfo=timezone.utc)
        assert (plan.kind, plan.fits, plan.strategy, plan.ds_config) == (
            "sft",
            True,
            {"zero_stage": 1},
            {"zero_optimization": {"stage": 1}},
        )
        assert storage.latest_plan() == plan
        saved = save(storage)
        assert storage.find_probe(saved.key) == saved
    assert stored_versions(path) == [HEAD_REVISION]
    assert_schema_is_the_orm(url)


def test_downgrading_to_0001_drops_probes_and_keeps_plans(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'plans.db'}"
    with SQLAlchemyStorage(url) as storage:
        plan = storage.save_plan(
            kind="sft",
            model="m",
            fits=True,
            workload={},
            hardware={},
            strategy={},
            predicted={},
            ds_config={},
            document={},
        )
        save(storage, run_id=storage.start_run(["k"], {}).run_id)
    config = alembic_config()
    config.set_main_option("sqlalchemy.url", url)
    command.downgrade(config, "0001")
    engine = create_engine(url)
    try:
        assert set(inspect(engine).get_table_names()) == {"memplan_alembic_version", "plans"}
    finally:
        engine.dispose()

    with SQLAlchemyStorage(url) as storage:  # and up again on the next open
        assert storage.list_plans() == [plan]
        assert storage.list_probes() == []
    assert_schema_is_the_orm(url)


def test_a_new_database_matches_the_orm(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'new.db'}"
    SQLAlchemyStorage(url).close()
    assert_schema_is_the_orm(url)


def test_importing_store_db_still_loads_neither_alembic_nor_sqlalchemy(tmp_path: Path) -> None:
    code = """
        import sys
        import store.db
        from store.db import ProbeRecord, ProbeRunRecord
        print("alembic" in sys.modules, "sqlalchemy" in sys.modules, "torch" in sys.modules)
    """
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False", "False"]
