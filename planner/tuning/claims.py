"""Which tune is probing which candidate of a shared study: one claim row per candidate, taken atomically.

Several tunes on one study (a team's PostgreSQL database, or several processes on one SQLite file) must give
each candidate to one of them. Optuna's own queue cannot: on SQLite its "pop a waiting trial" reads the
trial's state outside the write transaction (``SELECT ... FOR UPDATE`` is a no-op there), so two processes
take one trial, probe its candidate twice, and the second to tell it fails with ``UpdateFinishedTrialError``.

A claim is a row of Optuna's ``study_system_attributes`` table, whose ``(study_id, key)`` pair is unique in
every database: the key names the candidate (:func:`claim_key`), the value says who holds it (host, pid and
the process's start time). Taking a claim is one INSERT: the database lets exactly one tune have it, and
another gets an integrity error and moves on. The tune that probed a candidate records its trial first and
then deletes its claim, so a tune that takes the claim after it finds the trial. A claim whose holder is a
process of this host that is gone (a tune killed outright) is deleted by the next tune, which names the
candidate an orphan: :mod:`planner.tuning.rounds` probes it before it may stop.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from dataclasses import dataclass, field
from typing import Any

from probes.process.proc_stat import START, read_stat_fields
from store.processes import pid_alive

CLAIM_PREFIX = "memplan_claim:"
SQLITE_WAIT_S = 60.0  # how long a claim waits for another writer of the SQLite file (busy timeout)


def _started(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot, /proc/PID/stat's 22nd field), None where unknown:
    with the pid it names one process, even after the pid is reused."""
    fields = read_stat_fields(pid)  # the one parser of that line (a command name may hold ")")
    return fields[START].decode() if len(fields) > START else None


def owner() -> dict[str, Any]:
    """What a claim (or a trial) records of the process probing it, so that a run after it can tell it died."""
    return {"owner_host": socket.gethostname(), "owner_pid": os.getpid(), "owner_started": _started(os.getpid())}


def abandoned(attrs: dict[str, Any]) -> bool:
    """Whether the owner ``attrs`` name is a process of this host that is gone (killed outright: SIGKILL, an OOM
    kill, a lost node). Another host's owner is never judged from here."""
    pid = attrs.get("owner_pid")
    if attrs.get("owner_host") != socket.gethostname() or not isinstance(pid, int):
        return False
    if not pid_alive(pid):
        return True
    started = attrs.get("owner_started")
    return started is not None and _started(pid) not in (None, started)  # the pid now names another process


def claim_key(candidate: str) -> str:
    """The claim's key of a candidate: short and fixed-length (the column is indexed)."""
    return CLAIM_PREFIX + hashlib.sha256(candidate.encode()).hexdigest()[:40]


@dataclass
class Claims:
    """The claims of one study in the database at ``url`` (Optuna's storage URL), held by this process."""

    url: str
    study_id: int
    _engine: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        from sqlalchemy import create_engine, make_url

        from store.db import connect_args

        args = dict(connect_args(self.url))
        if make_url(self.url).get_backend_name() == "sqlite":
            args["timeout"] = SQLITE_WAIT_S
        self._engine = create_engine(self.url, connect_args=args)

    def _value(self, candidate: str) -> str:
        return json.dumps({"candidate": candidate, **owner()}, sort_keys=True)

    def take(self, candidate: str) -> bool:
        """Claim ``candidate`` for this process: True when it is now this process's to probe, False when another
        tune holds it (the database's unique key decides; nothing is waited for but the write lock)."""
        from optuna.storages._rdb.models import StudySystemAttributeModel as Row
        from sqlalchemy import insert
        from sqlalchemy.exc import IntegrityError

        row = {"study_id": self.study_id, "key": claim_key(candidate), "value_json": self._value(candidate)}
        try:
            with self._engine.begin() as conn:
                conn.execute(insert(Row).values(**row))
        except IntegrityError:
            return False
        return True

    def give_back(self, candidate: str) -> None:
        """Delete this process's claim of ``candidate`` (after its trial is recorded, or on an interrupt)."""
        self._delete(claim_key(candidate), self._value(candidate))

    def _delete(self, key: str, value: str) -> bool:
        from optuna.storages._rdb.models import StudySystemAttributeModel as Row
        from sqlalchemy import delete

        with self._engine.begin() as conn:
            done = conn.execute(
                delete(Row).where(Row.study_id == self.study_id, Row.key == key, Row.value_json == value)
            )
        return bool(done.rowcount)

    def held(self) -> tuple[set[str], set[str]]:
        """(candidates other live tunes hold now, candidates whose holder was found dead and whose claim this
        process deleted: orphans, to be probed again)."""
        from optuna.storages._rdb.models import StudySystemAttributeModel as Row
        from sqlalchemy import select

        with self._engine.connect() as conn:
            rows = conn.execute(
                select(Row.key, Row.value_json).where(Row.study_id == self.study_id, Row.key.like(CLAIM_PREFIX + "%"))
            ).all()
        live: set[str] = set()
        orphans: set[str] = set()
        for key, value in rows:
            try:
                data = json.loads(value)
                candidate = str(data["candidate"])
            except (ValueError, TypeError, KeyError):
                continue
            if abandoned(data):
                if self._delete(key, value):  # one tune frees it: the one whose DELETE found the row
                    orphans.add(candidate)
                continue
            live.add(candidate)
        return live, orphans

    def close(self) -> None:
        """Release the database connections."""
        self._engine.dispose()


def open_claims(url: str, study_name: str) -> Claims:
    """The claims of the study ``study_name`` kept at ``url`` (Optuna's storage URL; the study exists)."""
    from optuna.storages._rdb.models import StudyModel
    from sqlalchemy import select

    claims = Claims(url, 0)
    with claims._engine.connect() as conn:
        claims.study_id = int(
            conn.execute(select(StudyModel.study_id).where(StudyModel.study_name == study_name)).scalar_one()
        )
    return claims
