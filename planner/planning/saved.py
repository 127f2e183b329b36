"""The saved plans and probes: the API's reads and writes of the plan database, and ``export``.

Every function opens the database named by ``db`` (a SQLAlchemy URL or a SQLite file; default
``$PLANNER_DB``, else the user's data folder), does one thing and closes it. SQLAlchemy is imported
only here, on first use, so ``import planner`` stays light.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from planner.job.calibrated import calibrated
from planner.job.inputs import JobSpec, ResolvedJob, job_fields, resolve
from search import DEFAULT_COEFFICIENTS, Coefficients, replay_timeline
from store.db import holds_no_store, open_storage, would_create
from store.errors import InputError
from store.records import RLHFStrategy, Strategy
from store.workload_kinds import KINDS

if TYPE_CHECKING:
    from planner.report.results import Plan
    from store.db import CalibrationRecord, PlanRecord, ProbeRecord


MAX_LISTED = 100_000  # rows a listing prints at most
# The blocks of a saved plan's document that export, explain and their --plot read, and what each must be.
DOCUMENT_BLOCKS = ("workload", "hardware", "strategy")
OPTIONAL_BLOCKS: dict[str, type] = {"outside_settings": dict, "launch": dict, "alternatives": list}


def _positive_limit(limit: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 0 < limit <= MAX_LISTED:
        shown = str(limit) if len(str(limit)) <= 24 else str(limit)[:21] + "..."
        raise InputError(f"-n/--limit must be a whole number from 1 to {MAX_LISTED}, not {shown}")
    return limit


LISTED_DEVICES = ("cuda", "cpu")  # what a probe ran on (planner.probing.limits.DEVICES, one layer up)


def _listed_kind(kind: str | None) -> str | None:
    """``kind`` when it is None or a workload kind; InputError (one line) otherwise: a filter that can match
    nothing is a typo, not an empty listing."""
    if kind is not None and kind not in KINDS:
        raise InputError(f"--workload must be one of {', '.join(KINDS)}, not {_one_line(repr(kind), 40)}")
    return kind


def _listed_device(device: str | None) -> str | None:
    """``device`` when it is None, cuda or cpu; InputError (one line) otherwise."""
    if device is not None and device not in LISTED_DEVICES:
        raise InputError(f"--device must be cuda or cpu, not {_one_line(repr(device), 40)}")
    return device


def save_plan(plan: Plan, db: str | None = None) -> Plan:
    """Store a recommended plan; returns it with the ``plan_id`` the database gave it."""

    with open_storage(db) as storage:
        record = storage.save_plan(
            kind=plan.workload["kind"],
            model=plan.workload["model"],
            fits=plan.fits,
            workload=plan.workload,
            hardware=plan.hardware,
            strategy=plan.strategy,
            predicted=plan.predicted.model_dump(),
            ds_config=dict(plan.ds_config if plan.ds_config is not None else plan.ds_configs or {}),
            document=plan.model_dump(exclude={"plan_id"}),
        )
    return plan.model_copy(update={"plan_id": record.plan_id})


def plans(db: str | None = None, limit: int = 20, kind: str | None = None) -> list[PlanRecord]:
    """Saved plans, newest first (frozen ``store.db.PlanRecord`` values), optionally of one workload kind."""

    limit = _positive_limit(limit)
    kind = _listed_kind(kind)
    if holds_no_store(db):  # none saved; a mistyped --db is not created to say so
        return []
    with open_storage(db) as storage:
        return storage.list_plans(limit=limit, kind=kind)


def plan(plan_id: str | None = None, db: str | None = None) -> PlanRecord:
    """One saved plan by id or unique id prefix (the latest when None); InputError when there is none."""

    if holds_no_store(db):  # a mistyped --db is not created just to find nothing in it
        why = "does not exist" if would_create(db) else "holds no memplan tables"
        where = "" if db is None else f" (database {_one_line(str(db))} {why})"
        if plan_id:
            raise InputError(f"no saved plan has the id {_one_line(str(plan_id))!r}{where}")
        raise InputError(f"no plans saved yet{where}: run `planner recommend ...` first")
    with open_storage(db) as storage:
        record = storage.get_plan(plan_id) if plan_id else storage.latest_plan()
    if record is None:
        raise InputError("no plans saved yet: run `planner recommend ...` first")
    _check_document(record)
    return record


def _one_line(text: str, limit: int = 80) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _check_document(record: PlanRecord) -> None:
    """InputError (one line) when the blocks of a saved plan's document that the commands read are not of
    their shape: a row changed by hand."""
    document = record.document
    problems = [
        f"its {name} is not a JSON object" for name in DOCUMENT_BLOCKS if not isinstance(document.get(name), dict)
    ]
    for name, kind in OPTIONAL_BLOCKS.items():
        if name in document and not isinstance(document[name], kind):
            problems.append(f"its {name} is not a JSON {'object' if kind is dict else 'list'}")
    if problems:
        raise _damaged(record.plan_id, problems[0])


def _damaged(plan_id: object, why: str) -> InputError:
    return InputError(f"saved plan {plan_id} is damaged: {why}; `planner recommend` saves a new one")


def probes(
    db: str | None = None, limit: int = 20, model: str | None = None, device: str | None = None
) -> list[ProbeRecord]:
    """Stored probes, newest first (frozen ``store.db.ProbeRecord`` values), optionally of one model or device."""

    limit = _positive_limit(limit)
    device = _listed_device(device)
    if holds_no_store(db):  # none saved; a mistyped --db is not created to say so
        return []
    with open_storage(db) as storage:
        return storage.list_probes(limit=limit, model=model, device=device)


def calibrations(db: str | None = None, limit: int = 20, target: str | None = None) -> list[CalibrationRecord]:
    """Stored calibrations, newest first (frozen ``store.db.CalibrationRecord`` values), optionally of one
    target (``H100-80G``, ``cpu:<model>``)."""

    limit = _positive_limit(limit)
    if holds_no_store(db):  # none saved; a mistyped --db is not created to say so
        return []
    with open_storage(db) as storage:
        return storage.list_calibrations(limit=limit, target=target)


def plan_job(document: dict[str, Any], plan_id: str = "") -> JobSpec:
    """The job a saved plan's document was planned for (its workload and hardware blocks); InputError naming
    ``plan_id`` when they cannot be read (a row changed by hand)."""
    try:
        model = document["workload"]["model"]
        if not isinstance(model, str):
            raise TypeError(f"its model is {type(model).__name__}, not a name")
        return JobSpec(model=model, **job_fields(document["workload"], document["hardware"]))
    except (KeyError, TypeError, AttributeError) as exc:
        why = f"its workload or hardware cannot be read ({type(exc).__name__}: {_one_line(str(exc), 120)})"
        raise _damaged(plan_id, why) from None


def planned_coefficients(
    document: dict[str, Any], job: ResolvedJob, db: str | None
) -> tuple[ResolvedJob, Coefficients]:
    """The job and coefficients a saved plan was made with, as far as its document names them: the calibration
    its ``calibration`` block names (looked up again by id in ``db``; InputError where it is gone) over the
    defaults. For what a plan does not keep: its figures are in its document (``planner.planning.figures``)."""
    block = document.get("calibration") or {}
    found_id = block.get("id") if isinstance(block, dict) else None
    job, coef, _ = calibrated(
        job, DEFAULT_COEFFICIENTS, choice=found_id if isinstance(found_id, str) else "none", db=db
    )
    return job, coef


def memory_plot(
    plan_id: str | None, path: str | Path, db: str | None = None, *, force: bool = False
) -> tuple[Path, list[tuple[str, int, int]]]:
    """Draw a saved plan's step from the allocator replay (:mod:`planner.report.plot`) into ``path``; returns
    the file and each phase run's (name, peak allocated, peak reserved) bytes. A plan whose rollout runs on a
    vLLM or SGLang engine draws the engine's turn as a block of its own (its weights, KV cache, awake and asleep
    bytes, from the plan's ``predicted.rollout``), its rows first, beside the trainer's replayed phases. The step
    is replayed under the plan's own calibration (:func:`planned_coefficients`), as its prediction was."""
    from planner.report.plot import EngineTurn, PlanFigures, write_memory_plot  # the drawing: only when drawn

    record = plan(plan_id, db=db)
    document = record.document
    job = resolve(plan_job(document, record.plan_id), db)  # a traced model's shape is cached in the plan's own database
    parse = RLHFStrategy.from_dict if job.workload.is_rlhf else Strategy.from_dict
    strategy = parse(document["strategy"])
    engine = None
    if isinstance(strategy, RLHFStrategy) and strategy.rollout is not None:
        predicted = document.get("predicted")
        rollout = predicted.get("rollout") if isinstance(predicted, dict) else None
        if not isinstance(rollout, dict):
            raise _damaged(record.plan_id, f"it generates with {strategy.rollout.engine} but has no predicted.rollout")
        engine = EngineTurn.from_report(rollout)
    job, coef = planned_coefficients(document, job, db)
    timeline = replay_timeline(job.workload, strategy, job.hardware, coef)
    title = f"plan {record.plan_id}: {job.workload.model.name} {job.workload.kind}, {strategy.describe()}"
    figures = PlanFigures.from_document(document)
    return write_memory_plot(timeline, path, title, force=force, engine=engine, figures=figures)
