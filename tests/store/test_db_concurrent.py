"""Concurrent writers lose nothing (issue 11): several processes that write probes, probe runs, artifacts
and model shapes to one database at the same moment, as several ``planner probe`` or ``planner tune``
processes pointed at one team database do, all succeed, and every row each of them reported saved is
there afterwards, on a SQLite file and on PostgreSQL. On PostgreSQL the processes also tell trials to one
Optuna study kept in the same database, and no trial is lost.

The processes first open the storage (a fresh database: they also create its schema together), then
wait on stdin until all are ready, so their writes overlap; no assertion depends on time.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from store.db import open_storage, optuna_storage_url

REPO = Path(__file__).resolve().parents[2]
WRITERS = 4
PROBES_EACH = 20
TRIALS_EACH = 10
CHILD_TIMEOUT_S = 300.0  # a safety net against a hang; no assertion depends on time
STUDY = "concurrent-tune"

# argv: URL, writer number, whether to tell Optuna trials. Prints "ready", waits for a line, then writes
# and prints what it saved: "probe KEY PROBE_ID", "run RUN_ID", "trial NUMBER".
CHILD = (
    textwrap.dedent(
        """
    import sys

    from store.artifacts import ProbeArtifact
    from store.db import open_storage, optuna_storage_url
    from store.measurements import PhaseMeasurement, ProbeRequest, ProbeResult

    url, writer, with_optuna = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
    storage = open_storage(url)
    study = None
    if with_optuna:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.load_study(study_name="concurrent-tune", storage=optuna_storage_url(url))
    print("ready", flush=True)
    sys.stdin.readline()
    keys = [f"w{writer}-p{i}" for i in range(PROBES_EACH)]
    run = storage.start_run(keys, {"writer": writer})
    print("run", run.run_id, flush=True)
    for i, key in enumerate(keys):
        workload = {"kind": "sft", "model": f"m{writer}"}
        request = ProbeRequest(workload=workload, strategy={"micro_batch": i}, hardware={})
        result = ProbeResult("ok", phases=(PhaseMeasurement("forward", 1000 + i, 2000 + i, 0.01),))
        saved = storage.save_probe(request, result, key=key, run_id=run.run_id)
        print("probe", key, saved.probe_id, flush=True)
        if i % 5 == 0:  # replace-by-name writes that every writer aims at the same names
            storage.save_model_shape("shared-shape", {"model_type": "opt", "writer": writer, "i": i})
            storage.save_probe_artifact(saved.probe_id, ProbeArtifact("stream", "test/v1", bytes([writer, i])))
        if study is not None and i < TRIALS_EACH:
            trial = study.ask()
            x = trial.suggest_float("x", 0.0, 1.0)
            study.tell(trial, x)
            print("trial", trial.number, flush=True)
    storage.finish_run(run.run_id)
    storage.close()
    print("done", flush=True)
    """
    )
    .replace("PROBES_EACH", str(PROBES_EACH))
    .replace("TRIALS_EACH", str(TRIALS_EACH))
)


def run_writers(url: str, with_optuna: bool) -> list[list[str]]:
    """Start ``WRITERS`` child processes on ``url``, release them together, and return each one's lines."""
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, url, str(writer), "1" if with_optuna else "0"],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for writer in range(WRITERS)
    ]
    try:
        for child in children:  # every one has opened the database (and made its schema with the others)
            assert child.stdout is not None
            line = child.stdout.readline().strip()
            if line != "ready":
                _, err = child.communicate(timeout=CHILD_TIMEOUT_S)
                pytest.fail(f"a writer did not get ready: {line!r} {err[-2000:]}")
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        outputs = []
        for child in children:
            out, err = child.communicate(timeout=CHILD_TIMEOUT_S)
            assert child.returncode == 0, err[-2000:]
            lines = out.splitlines()
            assert lines[-1] == "done", err[-2000:]
            outputs.append(lines)
        return outputs
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()


@pytest.fixture(params=["sqlite-file", "postgresql"])
def team_db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A new database that several processes share: a SQLite file, or a database on a PostgreSQL server."""
    if request.param == "sqlite-file":
        return str(tmp_path / "team.db")
    url: str = request.getfixturevalue("postgres_url")
    return url


def test_concurrent_writers_lose_no_probe_run_or_trial(team_db: str) -> None:
    with_optuna = not team_db.endswith(".db")  # Optuna's own SQLite sessions are not for several writers
    if with_optuna:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        rdb = optuna.storages.RDBStorage(optuna_storage_url(team_db))
        optuna.create_study(study_name=STUDY, storage=rdb, direction="minimize")
    try:
        outputs = run_writers(team_db, with_optuna)
        check_everything_is_there(team_db, outputs)
        if with_optuna:
            study = optuna.load_study(study_name=STUDY, storage=rdb)
            told = sorted(int(line.split()[1]) for lines in outputs for line in lines if line.startswith("trial "))
            trials = study.get_trials(deepcopy=False)
            assert sorted(t.number for t in trials) == told == list(range(WRITERS * TRIALS_EACH))
            assert all(t.state == optuna.trial.TrialState.COMPLETE and t.value == t.params["x"] for t in trials)
    finally:
        if with_optuna:
            rdb.remove_session()
            rdb.engine.dispose()


def check_everything_is_there(team_db: str, outputs: list[list[str]]) -> None:
    """Every probe, run, artifact and the model shape the writers reported saved is in the database."""
    reported = {line.split()[1]: line.split()[2] for lines in outputs for line in lines if line.startswith("probe ")}
    runs = [line.split()[1] for lines in outputs for line in lines if line.startswith("run ")]
    assert len(reported) == WRITERS * PROBES_EACH and len(runs) == WRITERS
    with open_storage(team_db) as storage:
        stored = storage.list_probes(limit=10 * WRITERS * PROBES_EACH)
        assert {probe.key: probe.probe_id for probe in stored} == reported
        for key, probe_id in reported.items():
            found = storage.find_probe(key)
            assert found is not None and found.probe_id == probe_id
        for run_id in runs:
            run = storage.get_run(run_id)
            assert run.status == "done" and run.pending_keys == () and len(run.done_keys) == PROBES_EACH
        shape = storage.load_model_shape("shared-shape")
        assert shape is not None and shape["model_type"] == "opt"
        with_artifacts = [pid for pid in reported.values() if storage.list_probe_artifacts(pid)]
        assert len(with_artifacts) == WRITERS * len(range(0, PROBES_EACH, 5))
