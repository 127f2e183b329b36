"""Several ``tune`` processes on one study (issue 43): each candidate is probed by one of them, a tune that loses
a race moves on, none prints a traceback, all end 0. Four real tune processes on one SQLite file and on one
PostgreSQL database; each probe is the simulated device of ``test_tune`` (the race is in the database, not the
probe), which holds its candidate a moment so that the four overlap. The cost of real probes (4 x DeepSpeed on
the CPU, minutes on two cores) buys nothing here: ``planner tune --device cpu`` on a tiny model does the same.
The workers tune the CPU backend, as the issue's tunes did (``planner tune --device cpu ... --study shared``): their
refit after each probe fits the CPU's coefficients (a fraction of a CPU second), where a tune of a GPU fits the
allocator's replayed reserved bytes too (about 6 CPU s a refit, paid by every worker and buying nothing here).
They name their dtype (fp32, ``--dtype fp32``): a CPU tune without one asks DeepSpeed's accelerator which dtype
this processor runs fast (``planner.probing.device.cpu_probe_dtype``), seconds of imports in every worker.
The four are forked from one process that imported what a tune imports (torch among them: the calibration that
ends a tune asks torch for this machine's device) and nothing more: four processes of their own, each opening its
own connections after the fork, without paying the same imports four times (about 4 CPU s each). That process
serves the module (``Forks``): the SQLite and the PostgreSQL workers and the tune killed outright are forked from
it in turn, its imports (about 5 CPU s) paid once.

A tune killed outright (SIGKILL) leaves its claim behind; the next tune on the host frees it and probes the
candidate before it may stop, or says in its report that it did not (issue 43, item 7).
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from planner_helpers import REPO, subprocess_env

from probes.process.preloaded import _add_cpu

WORKERS_COUNT = 4
CPU_TUNE: dict[str, Any] = {"device": "cpu", "dtype": "fp32"}  # the workers' tune (see above), also the killed one
TIMEOUT_S = 600  # a safety net for a hung worker on a loaded machine; no assertion depends on speed

FORKS = """
import json, os, resource, signal, sys, time, traceback
sys.path[:0] = ["tests/planner", "tests"]
# what every worker would import on its own, imported once before the forks (no connection is open yet)
import optuna, sqlalchemy, torch
import planner.calibration.fit, planner.tuning.rounds, planner.tuning.run, probes.measure.host_rates, search
# and what a tune imports lazily: the API, Optuna's RDB storage and its Alembic migrations, SQLAlchemy's ORM
import planner.api, alembic.command, alembic.migration, optuna.storages._rdb.storage, sqlalchemy.orm
from test_tune import SimulatedDevice, _tune


class Held(SimulatedDevice):
    def __call__(self, request):
        time.sleep(0.5)  # the candidate stays claimed a moment: the other workers meet the claim
        return super().__call__(request)


class KilledOutright(SimulatedDevice):
    def __call__(self, request):
        if len(self.ran) == 1:  # the second probe: the tune is killed while it runs (SIGKILL: no handler runs)
            print(json.dumps(request.strategy, sort_keys=True), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__call__(request)


def work(db, max_probes, study):
    device = Held()
    named = {"study": study} if study else {}  # none: the job's own study, as a tune that names none
    report = _tune(db, device, "opt-125m", max_probes=max_probes, device="cpu", dtype="fp32", **named)
    print(json.dumps({"ran": device.ran, "stop": report.stop_reason}), flush=True)


def killed(db):
    _tune(db, KilledOutright(), "opt-125m", max_probes=12, study="shared", device="cpu", dtype="fp32")


spent = 0.0
for line in sys.stdin:  # one request a line: fork its processes, wait for them, say so
    request = json.loads(line)
    pids = []
    for _ in range(request["count"]):
        pid = os.fork()
        if pid == 0:  # a worker: its own process, its own connections, its output in the request's files
            code = 1
            try:
                for fd, name in ((1, "out"), (2, "err")):
                    os.dup2(os.open(request[name], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644), fd)
                if request["kind"] == "killed":
                    killed(request["db"])
                else:
                    work(request["db"], request["max_probes"], request["study"])
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        pids.append(pid)
    codes, cpu_s = [], 0.0
    for pid in pids:
        _, status, usage = os.wait4(pid, 0)
        codes.append(os.waitstatus_to_exitcode(status))
        cpu_s += usage.ru_utime + usage.ru_stime
    own = resource.getrusage(resource.RUSAGE_SELF)  # the imports, charged to the first request
    cpu_s += own.ru_utime + own.ru_stime - spent
    spent = own.ru_utime + own.ru_stime
    print(json.dumps({"exit_codes": codes, "cpu_s": cpu_s}), flush=True)
"""


class Forks:
    """One process that imported what a tune imports (``FORKS``) and forks tunes on request: the workers of a
    shared study, or a tune killed outright. Its imports (about 5 CPU s) are paid once for the module's tests."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.requests, self.reported_cpu_s = folder, 0, 0.0
        with (folder / "forks.err").open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", FORKS], cwd=REPO, env=subprocess_env(), stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=err, text=True,
            )  # fmt: skip

    def run(self, kind: str, count: int, **request: Any) -> tuple[subprocess.CompletedProcess[str], list[int]]:
        """Fork ``count`` processes of ``kind`` ("workers" or "killed"); (their output as one process's run, each
        one's exit code). The run's returncode is 0 when the forking process answered."""
        self.requests += 1
        out, err = self.folder / f"{self.requests}.out", self.folder / f"{self.requests}.err"
        line = json.dumps({"kind": kind, "count": count, "out": str(out), "err": str(err), **request})
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], TIMEOUT_S)
        answer = self.proc.stdout.readline() if ready else ""
        if not answer:
            self.proc.kill()
            raise AssertionError(f"the forking process did not answer: {self.errors()[-3000:]}")
        reply = json.loads(answer)
        codes: list[int] = reply["exit_codes"]
        # the CPU seconds of the request (the workers', and the imports at the first): counted for the test now, as
        # the probes' preloaded starter reports its children (tests/cpu_budget.py), not when this process ends
        _add_cpu(reply["cpu_s"])
        self.reported_cpu_s += reply["cpu_s"]
        read = [path.read_text() if path.exists() else "" for path in (out, err)]
        return subprocess.CompletedProcess(kind, 0, read[0], read[1]), codes

    def errors(self) -> str:
        return (self.folder / "forks.err").read_text(errors="replace")

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=TIMEOUT_S)
        _add_cpu(-self.reported_cpu_s)  # reaped: getrusage(RUSAGE_CHILDREN) counts them from now on
        self.reported_cpu_s = 0.0
        assert "Traceback" not in self.errors(), self.errors()[-3000:]


@pytest.fixture(scope="module")
def forks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Forks]:
    """The module's forking process, ended with the module."""
    forks = Forks(tmp_path_factory.mktemp("forks"))
    try:
        yield forks
    finally:
        forks.close()


def run_workers(
    db: str, max_probes: int, count: int = WORKERS_COUNT, study: str = "shared", forks: Forks | None = None
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    """Run ``count`` workers (``study`` "": the job's own) forked by ``forks`` (None: a forking process of their
    own); (the workers' run, each worker's line: the candidates it ran and its stop, then their exit codes)."""
    if forks is None:
        with tempfile.TemporaryDirectory(prefix="memplan-forks-") as folder:
            own = Forks(Path(folder))
            try:
                return run_workers(db, max_probes, count, study, own)
            finally:
                own.close()
    run, codes = forks.run("workers", count, db=db, max_probes=max_probes, study=study)
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    return run, [*lines, {"exit_codes": codes}]


def _probe_counts(db: str) -> Counter[str]:
    from planner import probes

    return Counter(json.dumps(p.request.strategy, sort_keys=True) for p in probes(db=db, limit=1000))


def _check_shared(db: str, forks: Forks) -> None:
    run, lines = run_workers(db, 1, forks=forks)
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    assert run.returncode == 0, run.stderr[-3000:]
    assert lines[-1] == {"exit_codes": [0] * WORKERS_COUNT}, (lines[-1], run.stderr[-3000:])  # every worker ended 0
    reports = lines[:-1]
    assert len(reports) == WORKERS_COUNT, run.stdout[-3000:]
    ran = [key for report in reports for key in report["ran"]]
    counts = _probe_counts(db)
    assert counts and max(counts.values()) == 1, counts.most_common(2)  # each strategy probed exactly once
    assert sorted(counts) == sorted(ran)  # every probe stored is one a worker ran, none twice
    from optuna import load_study

    from store.db import optuna_storage_url

    study = load_study(study_name="shared", storage=optuna_storage_url(db))
    measured = [t.params["candidate"] for t in study.trials if "probe_id" in t.user_attrs]
    assert len(measured) == len(set(measured)) == len(counts)  # one trial per probed candidate, none failed twice
    assert not [t for t in study.trials if t.state.name == "RUNNING"]
    assert not _claims(db)  # every claim given back


def _claims(db: str) -> list[str]:
    """The claim rows left in the study (Optuna's public storage API)."""
    import optuna

    from store.db import optuna_storage_url

    storage = optuna.storages.RDBStorage(optuna_storage_url(db))
    try:
        attrs = storage.get_study_system_attrs(storage.get_study_id_from_name("shared"))
    finally:
        storage.engine.dispose()
    return [key for key in attrs if key.startswith("memplan_claim:")]


def test_four_tunes_share_one_sqlite_study_and_probe_each_candidate_once(tmp_path: Path, forks: Forks) -> None:
    _check_shared(str(tmp_path / "plans.db"), forks)


def test_four_tunes_share_one_postgresql_study_and_probe_each_candidate_once(postgres_url: str, forks: Forks) -> None:
    _check_shared(postgres_url, forks)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _orphan(db: Path, candidate: str, pid: int) -> None:
    """A running trial of ``candidate`` whose owner, a process of this host, is gone (as a tune killed outright
    while it probed left one)."""
    import socket

    from optuna import load_study
    from optuna.distributions import CategoricalDistribution

    from store.db import optuna_storage_url

    study = load_study(study_name="shared", storage=optuna_storage_url(str(db)))
    study.enqueue_trial({"candidate": candidate})
    trial = study.ask({"candidate": CategoricalDistribution(study.user_attrs["candidates"])})
    assert trial.params["candidate"] == candidate
    for name, value in {"owner_host": socket.gethostname(), "owner_pid": pid, "owner_started": None}.items():
        trial.set_user_attr(name, value)


def test_an_orphaned_candidate_is_probed_before_the_tune_may_stop(db: Path) -> None:
    """A confirmed study, then two candidates left running by tunes killed outright: the next tune probes the
    orphan although its stopping rule already holds; with room for one probe only, its report names the other."""
    from test_tune import SimulatedDevice, _tune

    first = _tune(db, SimulatedDevice(), max_probes=12, study="shared")
    assert first.confirmed
    measured = {json.dumps(row["strategy"], sort_keys=True, separators=(",", ":")) for row in first.rows}
    from optuna import load_study

    from store.db import optuna_storage_url

    space: list[Any] = load_study(study_name="shared", storage=optuna_storage_url(str(db))).user_attrs["candidates"]
    left = [key for key in space if key not in measured]
    assert len(left) >= 2
    for key in left[:2]:
        _orphan(db, key, _dead_pid())
    device = SimulatedDevice()
    again = _tune(db, device, max_probes=1, study="shared")
    probed = [json.dumps(json.loads(key), sort_keys=True) for key in left[:2]]
    assert len(device.ran) == 1 and device.ran[0] in probed  # probed although the stopping rule held
    assert "not probed" in again.stop_reason and not again.confirmed  # the other one: said, not hidden
    study = load_study(study_name="shared", storage=optuna_storage_url(str(db)))
    assert not [t for t in study.trials if t.state.name == "RUNNING"]


def test_a_claim_left_by_a_tune_killed_outright_is_probed_by_the_next(db: Path, forks: Forks) -> None:
    """A tune killed with SIGKILL cannot give its claim back; the next run on this host sees its owner is gone,
    frees the claim and probes the candidate before it stops (not another machine's probe, never done)."""
    from test_tune import SimulatedDevice, _tune

    killed, (code,) = forks.run("killed", 1, db=str(db))  # FORKS' KilledOutright: a tune killed by SIGKILL
    assert code == -9, killed.stderr[-2000:]
    orphaned = killed.stdout.strip().splitlines()[-1]
    assert _claims(str(db))  # the killed tune's claim is still there
    device = SimulatedDevice()
    report = _tune(db, device, "opt-125m", max_probes=12, study="shared", **CPU_TUNE)
    assert device.ran.count(orphaned) == 1  # probed by the next tune, once
    assert report.plan is not None and "not probed" not in report.stop_reason
    assert not _claims(str(db))  # freed, probed, given back
    assert not any(k.startswith("owner_") for row in report.rows for k in row)


@pytest.fixture(autouse=True)
def _tests_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))


def test_a_candidate_is_claimed_by_one_tune_and_a_dead_owners_claim_is_freed_once(tmp_path: Path) -> None:
    """The claim itself: of two claimants one wins, a claim given back can be taken again, and the claim of a
    process that is gone is freed by one of the tunes that find it (the orphan is theirs to probe)."""
    import socket

    from planner.tuning.claims import claim_key, open_claims
    from planner.tuning.study import open_study
    from store.db import open_storage, optuna_storage_url

    db = str(tmp_path / "plans.db")
    open_storage(db).close()
    url = optuna_storage_url(db)
    open_study(url, "shared", ["a", "b", "c"])
    one, two = open_claims(url, "shared"), open_claims(url, "shared")
    try:
        assert one.take("a") and not two.take("a") and two.take("b")
        one.give_back("a")
        assert two.take("a")
        assert one.held() == ({"a", "b"}, set())  # held by a live process: not freed
        dead = {"candidate": "c", "owner_host": socket.gethostname(), "owner_pid": _dead_pid(), "owner_started": None}
        from optuna.storages._rdb.models import StudySystemAttributeModel as Row
        from sqlalchemy import insert

        with one._engine.begin() as conn:
            conn.execute(insert(Row).values(study_id=one.study_id, key=claim_key("c"), value_json=json.dumps(dead)))
        assert not two.take("c")  # claimed, though by no one alive
        assert one.held() == ({"a", "b"}, {"c"}) and two.held() == ({"a", "b"}, set())  # freed once
        assert two.take("c")
    finally:
        one.close()
        two.close()
