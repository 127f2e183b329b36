"""The tune's study and its candidates: the space the cost model ranks (fixed when the study is created, so a
resumed or shared study asks over the same ones), the Optuna study kept in the plan database, a candidate's
prediction and its probe (one probe session, :mod:`planner.probing.runs`), and the calibration refit to every
stored probe of the device."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

from planner.calibration.gather import gather, stored_entries
from planner.job.inputs import ResolvedJob
from planner.probing.device import device_coefficients, device_prediction
from planner.probing.plan import plan_probes
from planner.probing.program import run_program_strategy
from planner.probing.runs import ProbeSession, ProbeSettings
from search import Coefficients, Prediction, predict, search
from search.calibration import calibrate
from store.db import connect_args, open_storage
from store.errors import InputError
from store.measurements import ProbeResult
from store.records import RLHFStrategy, Strategy

SPACE_SIZE = 24  # candidates a study asks over: the fastest predicted to fit


NOISE_FLOOR = 0.02  # a step time is never known better than this


MAX_PROBES = 50


STUDY_PREFIX = "memplan-tune-"


STUDY_OPEN_ATTEMPTS = 8


def candidate_key(strategy: Strategy | RLHFStrategy) -> str:
    """The candidate's name in the study: its strategy document as canonical JSON."""
    return json.dumps(strategy.to_dict(), sort_keys=True, separators=(",", ":"))


def study_name(job: ResolvedJob, device: str, program: str | None = None) -> str:
    """The default study of a job on a device: a hash of the workload, hardware and device (and, for a tune of
    the user's own program, its program id: another program is another study)."""
    parts: list[Any] = [job.workload.to_dict(), job.hardware.to_dict(), device]
    if program is not None:
        parts.append({"program": program})
    text = json.dumps(parts, sort_keys=True)
    return STUDY_PREFIX + hashlib.sha256(text.encode()).hexdigest()[:16]


def parse_candidate(job: ResolvedJob, key: str) -> Strategy | RLHFStrategy:
    """The strategy a candidate key names (the shape of the job's workload)."""
    data = json.loads(key)
    return RLHFStrategy.from_dict(data) if job.workload.is_rlhf else Strategy.from_dict(data)


def predicted_for(job: ResolvedJob, key: str, coef: Coefficients, device: str) -> Prediction:
    """The candidate's prediction as the probed device shows it (the CPU backend's view on ``cpu``)."""

    return device_prediction(
        predict(job.workload, parse_candidate(job, key), job.hardware, device_coefficients(device, coef)), device
    )


def candidate_space(job: ResolvedJob, coef: Coefficients) -> list[str]:
    """The candidates: distinct strategies the search predicts to fit, fastest first (those a probe can run:
    DeepSpeed's own generation for RLHF)."""
    result = search(job.workload, job.hardware, coef, rollouts=("hybrid-engine",))
    keys: list[str] = []
    for candidate in result.feasible:
        key = candidate_key(candidate.strategy)
        if key not in keys:
            keys.append(key)
    if not keys:
        raise InputError("no strategy is predicted to fit this job: nothing to tune (see planner recommend)")
    return keys[:SPACE_SIZE]


def step_noise(result: ProbeResult) -> float:
    """The measured relative spread of a probe's step time ((max - min) / median over its steps)."""
    spread = result.extra.get("step_time_s") or {}
    median = float(spread.get("median") or 0.0)
    if median <= 0:
        return NOISE_FLOOR
    return max(NOISE_FLOOR, (float(spread.get("max", median)) - float(spread.get("min", median))) / median)


@contextmanager
def study_errors(url: str) -> Iterator[None]:
    """Failures of Optuna's storage in the block (a table schema from another Optuna version, a damaged or
    unusable database) as one InputError line naming the database (password hidden)."""
    from optuna.exceptions import OptunaError
    from sqlalchemy import make_url
    from sqlalchemy.exc import SQLAlchemyError

    try:
        yield
    except InputError:
        raise
    except (RuntimeError, OptunaError, SQLAlchemyError) as exc:  # Optuna's schema checks raise RuntimeError
        shown = make_url(url).render_as_string(hide_password=True)
        reason = " ".join(str(getattr(exc, "orig", None) or exc).split()) or type(exc).__name__
        raise InputError(f"cannot use the Optuna study of the tune in database {shown}: {reason}") from None


def check_optuna_schema(url: str) -> None:
    """RuntimeError (as Optuna's own check says it, after creating its tables) when the database holds Optuna's
    version table at a revision other than this Optuna's head: refused here, before anything is written."""
    import os

    import optuna.storages._rdb.storage as rdb
    from alembic.script import ScriptDirectory
    from sqlalchemy import create_engine, inspect, text

    engine = create_engine(url, connect_args=connect_args(url))
    try:
        with engine.connect() as conn:
            if not inspect(conn).has_table("alembic_version"):
                return
            found = [str(v) for v in conn.execute(text("SELECT version_num FROM alembic_version")).scalars()]
    finally:
        engine.dispose()
    head = ScriptDirectory(os.path.join(os.path.dirname(rdb.__file__), "alembic")).get_current_head()
    if found and found != [head]:
        raise RuntimeError(
            f"its Optuna tables are at schema {', '.join(found)}, not {head} (Optuna {optuna_version()}): "
            "`optuna storage upgrade --storage URL` upgrades an older one; a newer one needs a newer Optuna"
        )


def optuna_version() -> str:
    """The Optuna version installed."""
    import optuna

    return str(optuna.__version__)


def open_study(url: str, name: str, space: list[str]) -> Any:
    """The study ``name`` in the database at ``url`` (created with ``space`` as its candidates, or loaded
    with the candidates it was created with); InputError (``study_errors``) when Optuna cannot use it."""
    import optuna
    from sqlalchemy.exc import SQLAlchemyError

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with study_errors(url):
        check_optuna_schema(url)  # before Optuna creates its tables in a database it will then refuse
        for attempt in range(STUDY_OPEN_ATTEMPTS):
            try:  # two machines starting on a new database both create Optuna's tables: the second one waits
                kwargs = {"connect_args": connect_args(url)}  # PostgreSQL: UTF-8 even on a SQL_ASCII database
                storage = optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
                study = optuna.create_study(study_name=name, storage=storage, direction="minimize", load_if_exists=True)
                break
            except SQLAlchemyError:
                if attempt == STUDY_OPEN_ATTEMPTS - 1:
                    raise
                time.sleep(0.2 * (attempt + 1))
        if "candidates" not in study.user_attrs:
            study.set_user_attr("candidates", space)
    return study


def refit_values(base: Coefficients, target: str, db: str | None, device: str) -> dict[str, float]:
    """Calibration values refit to every stored probe of the device (no held-out pass: that is for the end)."""

    try:
        return dict(
            calibrate(gather(stored_entries(db, device), target, db=db).observations, base, leave_one_out=False).values
        )
    except (InputError, ValueError):
        return {}


@dataclass(frozen=True)
class ProgramCommand:
    """The user's own program a tune confirms its candidates on (``planner tune ... -- CMD``): the launch command
    and its fingerprint (``planner.probing.program.command_fingerprint``)."""

    command: tuple[str, ...]
    program: dict[str, Any]


def probe_candidate(
    job: ResolvedJob,
    key: str,
    settings: ProbeSettings,
    *,
    coef: Coefficients,
    db: str | None,
    on_start: Callable[[str], None] | None = None,
    program: ProgramCommand | None = None,
) -> tuple[str, ProbeResult, bool]:
    """(probe id, result, whether it ran now) of the candidate at full depth: a stored probe of the same
    request is reused (a timeout only when it had at least this timeout), so a resumed tune runs nothing twice.
    ``on_start`` is called with the candidate's label when it is about to run (after DeepSpeed's ops are built).
    With ``program`` the candidate runs in the user's program instead of memplan's loop
    (:func:`planner.probing.program.run_program_strategy`, stored and reused the same way)."""
    if program is not None:
        strategy = parse_candidate(job, key)
        assert isinstance(strategy, Strategy)  # a program tune is refused for RLHF before it starts
        done = run_program_strategy(
            job,
            strategy,
            list(program.command),
            program=program.program,
            settings=settings,
            coef=coef,
            db=db,
            on_start=partial(on_start, strategy.describe()) if on_start is not None else None,
        )
        return done.probe_id, done.result, done.ran

    planned = plan_probes(job, [parse_candidate(job, key)], settings, layers=None, coef=coef)
    item = next((p for p in planned if p.layers is None), None)
    if item is None:
        raise InputError("tune probes the whole model: on the CPU backend that is a model of at most 200M parameters")
    with open_storage(db) as storage:
        session = ProbeSession(storage, settings.runner)
        known = session.stored(item)
        if known is not None:
            return known.probe_id, known.result, False
        session.prepare([item.request])
        if on_start is not None:
            on_start(item.label)
        probe_id, result = session.run(item)
    return probe_id, result, True
