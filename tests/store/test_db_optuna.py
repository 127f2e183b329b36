"""The store and Optuna's RDB storage share one database (issue 11: ``planner tune`` keeps its study beside
the plans and probes). The store keeps its schema version in ``memplan_alembic_version``, Optuna in
``alembic_version``: whichever opens the database first, the other then opens it too, and both keep
working, on a SQLite file and on PostgreSQL. A database from before the store's own version table (its
revision in ``alembic_version``) moves it on the first writable open; a read-only open works on it, or
says why not. ``optuna_storage_url`` names the database the store opens, resolved the same way.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
from alembic import command
from sqlalchemy import create_engine, inspect, text

from store.artifacts import ProbeArtifact
from store.db import BaseStorage, default_db_url, open_storage, optuna_storage_url
from store.db._schema import HEAD_REVISION, LEGACY_VERSION_TABLE, VERSION_TABLE, alembic_config
from store.errors import InputError
from store.measurements import PhaseMeasurement, ProbeRequest, ProbeResult

STUDY = "tune-opt-125m"
PLAN: dict[str, Any] = dict(
    kind="sft", model="m", fits=True, workload={}, hardware={}, strategy={}, predicted={}, ds_config={}, document={}
)


@pytest.fixture(autouse=True)
def quiet_optuna() -> None:
    """Optuna logs every trial at INFO."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(params=["sqlite-file", "postgresql"])
def shared_db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """What a user gives as ``--db``: a SQLite file path, or a PostgreSQL URL."""
    if request.param == "sqlite-file":
        return str(tmp_path / "team.db")
    url: str = request.getfixturevalue("postgres_url")
    return url


class Study:
    """Optuna's side: an RDBStorage on ``optuna_storage_url(db)``, its connections closed afterwards."""

    def __init__(self, db: str) -> None:
        self.storage = optuna.storages.RDBStorage(optuna_storage_url(db))

    def tell_trials(self, n: int) -> optuna.Study:
        """Create (or load) the study and tell it ``n`` more trials."""
        study = optuna.create_study(study_name=STUDY, storage=self.storage, load_if_exists=True)
        for _ in range(n):
            trial = study.ask()
            study.tell(trial, trial.suggest_float("x", 0.0, 1.0))
        return study

    def values(self) -> list[float]:
        """The values of the study's trials, loaded again, in trial order."""
        study = optuna.load_study(study_name=STUDY, storage=self.storage)
        trials = sorted(study.get_trials(), key=lambda t: t.number)
        assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
        return [float(t.value) for t in trials if t.value is not None]

    def close(self) -> None:
        """Release Optuna's connections."""
        self.storage.remove_session()
        self.storage.engine.dispose()


@pytest.fixture
def studies() -> Iterator[list[Study]]:
    """Every ``Study`` a test opens (append it), closed at the end."""
    opened: list[Study] = []
    yield opened
    for study in opened:
        study.close()


def exercise(storage: BaseStorage, tag: str) -> None:
    """Every operation of the storage contract, checked by reading back what it wrote."""
    plan = storage.save_plan(**(PLAN | {"model": f"model-{tag}"}))
    assert storage.get_plan(plan.plan_id) == plan and storage.latest_plan() == plan
    assert plan in storage.list_plans(kind="sft")
    keys = [f"{tag}-a", f"{tag}-b"]
    run = storage.start_run(keys, {"tag": tag})
    assert storage.unfinished_run(keys) == run
    request = ProbeRequest(workload={"kind": "sft", "model": f"model-{tag}"}, strategy={}, hardware={})
    stream = ProbeArtifact("stream", "test/v1", b"\x00\x01" + tag.encode())
    result = ProbeResult("ok", phases=(PhaseMeasurement("forward", 10, 20, 0.5),), artifacts=(stream,))
    probe = storage.save_probe(request, result, key=keys[0], run_id=run.run_id)
    assert storage.find_probe(keys[0]) == probe and storage.get_probe(probe.probe_id) == probe
    assert probe in storage.list_probes(model=f"model-{tag}")
    assert storage.load_probe_artifact(probe.probe_id, "stream") == stream
    storage.save_probe_artifact(probe.probe_id, ProbeArtifact("stream", "test/v1", b"again"))
    assert storage.list_probe_artifacts(probe.probe_id) == {"stream": 5}
    storage.save_model_shape(f"shape-{tag}", {"model_type": "opt", "layers": 2})
    assert storage.load_model_shape(f"shape-{tag}") == {"model_type": "opt", "layers": 2}
    finished = storage.finish_run(run.run_id)
    assert finished.status == "done" and finished.done_keys == (keys[0],)
    assert storage.get_run(run.run_id) == finished


def store_tables_and_versions(db: str) -> tuple[set[str], dict[str, list[str]]]:
    """The database's tables, and the rows of each Alembic version table in it."""
    engine = create_engine(optuna_storage_url(db))
    try:
        with engine.connect() as conn:
            names = set(inspect(conn).get_table_names())
            versions = {
                table: [row[0] for row in conn.execute(text(f"SELECT version_num FROM {table}"))]
                for table in (VERSION_TABLE, LEGACY_VERSION_TABLE)
                if table in names
            }
    finally:
        engine.dispose()
    return names, versions


def test_store_first_then_optuna_then_the_store_again(shared_db: str, studies: list[Study]) -> None:
    with open_storage(shared_db) as storage:
        exercise(storage, "first")
    studies.append(Study(shared_db))
    studies[0].tell_trials(3)
    with open_storage(shared_db) as storage:
        exercise(storage, "second")
        assert len(storage.list_plans()) == 2
    assert len(studies[0].values()) == 3
    studies.append(Study(shared_db))  # Optuna opens it again after the store did
    studies[1].tell_trials(2)
    assert len(studies[1].values()) == 5
    names, versions = store_tables_and_versions(shared_db)
    assert {"plans", "probes", "studies", "trials"} <= names
    assert versions[VERSION_TABLE] == [HEAD_REVISION] and len(versions[LEGACY_VERSION_TABLE]) == 1
    assert versions[LEGACY_VERSION_TABLE] != [HEAD_REVISION]  # Optuna's own revision


def test_optuna_first_then_the_store_then_optuna_again(shared_db: str, studies: list[Study]) -> None:
    studies.append(Study(shared_db))
    studies[0].tell_trials(3)
    with open_storage(shared_db) as storage:
        exercise(storage, "first")
    with open_storage(shared_db) as storage:
        exercise(storage, "second")
    assert len(studies[0].values()) == 3
    studies.append(Study(shared_db))
    studies[1].tell_trials(1)
    assert len(studies[1].values()) == 4
    with open_storage(shared_db) as storage:
        assert len(storage.list_plans()) == 2 and len(storage.list_probes()) == 2


def make_legacy(db: str, revision: str = HEAD_REVISION) -> None:
    """Make ``db`` a store database at ``revision`` as a memplan before the rename left it: its revision in
    ``alembic_version`` (Alembic's layout, primary key ``alembic_version_pkc``)."""
    config = alembic_config()
    config.set_main_option("sqlalchemy.url", optuna_storage_url(db).replace("%", "%%"))
    command.upgrade(config, revision)
    engine = create_engine(optuna_storage_url(db))
    try:
        with engine.begin() as conn:
            conn.execute(text(f"DROP TABLE {VERSION_TABLE}"))
            conn.execute(
                text(
                    f"CREATE TABLE {LEGACY_VERSION_TABLE} (version_num VARCHAR(32) NOT NULL,"
                    f" CONSTRAINT {LEGACY_VERSION_TABLE}_pkc PRIMARY KEY (version_num))"
                )
            )
            conn.execute(text(f"INSERT INTO {LEGACY_VERSION_TABLE} VALUES ('{revision}')"))
    finally:
        engine.dispose()


@pytest.mark.parametrize("revision", ["0002", HEAD_REVISION])
def test_a_database_from_before_the_rename_moves_its_version_and_then_holds_a_study(
    shared_db: str, studies: list[Study], revision: str
) -> None:
    make_legacy(shared_db, revision)
    with open_storage(shared_db) as storage:  # moves the version (and upgrades 0002) in one transaction
        exercise(storage, "moved")
    names, versions = store_tables_and_versions(shared_db)
    assert versions == {VERSION_TABLE: [HEAD_REVISION]} and "probe_artifacts" in names
    studies.append(Study(shared_db))
    studies[0].tell_trials(2)
    with open_storage(shared_db) as storage:
        exercise(storage, "after-optuna")
    assert len(studies[0].values()) == 2


def test_a_read_only_open_of_a_database_from_before_the_rename(tmp_path: Path) -> None:
    at_head, older = tmp_path / "head.db", tmp_path / "older.db"
    make_legacy(str(at_head))
    make_legacy(str(older), "0002")
    with open_storage(f"{at_head}?mode=ro") as storage:  # its tables are current: it reads them as they are
        assert storage.list_plans() == [] and storage.find_probe("k") is None
    with pytest.raises(InputError, match="is at the older schema '0002' and mode=ro cannot upgrade it"):
        open_storage(f"{older}?mode=ro")
    for path in (at_head, older):  # nothing was moved by a read-only open
        with sqlite3.connect(path) as conn:
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert LEGACY_VERSION_TABLE in tables and VERSION_TABLE not in tables
    with open_storage(str(older)) as storage:  # and a writable open then upgrades it
        exercise(storage, "upgraded")


def test_a_failed_upgrade_leaves_the_old_version_where_it_was(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    make_legacy(str(db), "0002")
    with sqlite3.connect(db) as conn:  # 0003 creates probe_artifacts: make that fail
        conn.execute("CREATE TABLE probe_artifacts (x INTEGER)")
    with pytest.raises(InputError, match="probe_artifacts"):
        open_storage(str(db))
    with sqlite3.connect(db) as conn:
        assert conn.execute(f"SELECT version_num FROM {LEGACY_VERSION_TABLE}").fetchall() == [("0002",)]
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert VERSION_TABLE not in tables


def test_optuna_storage_url_resolves_the_database_as_the_store_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PLANNER_DB", raising=False)
    assert optuna_storage_url("plans.db") == f"sqlite:///{tmp_path / 'plans.db'}"
    assert optuna_storage_url(tmp_path / "odd 100%#.db") == f"sqlite:///{tmp_path}/odd 100%25%23.db"
    assert optuna_storage_url(f"sqlite:///{tmp_path}/x.db?mode=rw") == f"sqlite:///{tmp_path / 'x.db'}"
    assert optuna_storage_url(None) == default_db_url()  # the user data folder's memplan.db
    monkeypatch.setenv("PLANNER_DB", "team.db")
    assert optuna_storage_url(None) == f"sqlite:///{tmp_path / 'team.db'}"
    server = "postgresql+psycopg://me:pw@db.example:5432/memplan"
    assert optuna_storage_url(server) == server  # with its password: Optuna must connect


@pytest.mark.parametrize(
    ("db", "match"),
    [
        (":memory:", "in-memory database"),
        ("sqlite://", "in-memory database"),
        ("plans.db?mode=ro", "mode=ro"),
        ("", "empty"),
        ("plans.db?bogus=1", "unknown parameter 'bogus'"),
    ],
)
def test_optuna_storage_url_refuses_what_cannot_hold_a_study(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, db: str, match: str
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match=match):
        optuna_storage_url(db)
    assert list(tmp_path.iterdir()) == []


def test_optuna_opened_the_store_s_file_through_the_url(tmp_path: Path, studies: list[Study]) -> None:
    db = tmp_path / "same.db"
    with open_storage(str(db)) as storage:
        exercise(storage, "x")
    studies.append(Study(str(db)))
    studies[0].tell_trials(1)
    assert [p.name for p in tmp_path.iterdir()] == ["same.db"]  # one file: the same database
