"""Which calibration a prediction uses, and applying it: the newest stored fit for the job's GPU (or one
named by id), its values put into the job's hardware and coefficients, and one block saying which.

``choice`` is ``auto`` (the newest calibration of the job's target, if the database has one), ``none``
(the defaults), or a calibration id (or unique prefix), used whatever GPU the job names.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from planner.job.host_terms import host_terms, host_terms_line
from planner.job.inputs import ResolvedJob
from planner.job.target import target_hardware
from search import Coefficients
from search.calibration import CALIBRATION_VERSION, apply_values
from store.db import database_exists, open_storage
from store.errors import InputError
from store.gpus import GENERIC_PREFIX

CHOICES_HELP = "auto (the newest fit for the job's GPU), none (the defaults), or a calibration id"


def _shown(text: str, limit: int) -> str:
    """``text`` on one line, cut to ``limit`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _record(choice: str, target: str, db: str | None) -> tuple[Any, str]:
    """(the calibration record or None, why there is none)."""

    if not database_exists(db):
        if choice != "auto":  # an id the user named is never silently replaced by the defaults
            where = "the default database" if db is None else f"database {_shown(str(db), 80)}"
            raise InputError(
                f"--calibration {_shown(choice, 40)}: no calibration has that id ({where} does not exist yet)"
            )
        return None, "no database yet"
    with open_storage(db) as storage:
        if choice == "auto":
            found = storage.latest_calibration(target, CALIBRATION_VERSION)
            return found, "" if found else "none stored for it"
        return storage.get_calibration(choice), ""


def calibrated(
    job: ResolvedJob, coef: Coefficients, *, choice: str = "auto", db: str | None = None, target: str | None = None
) -> tuple[ResolvedJob, Coefficients, dict[str, Any]]:
    """The job and coefficients with the chosen calibration applied, and the ``calibration`` block of the
    report (``id`` None when none applies, with ``why``). ``target`` defaults to the job's GPU."""
    if not isinstance(choice, str) or not choice.strip():
        raise InputError(f"--calibration must be {CHOICES_HELP}, not {choice!r}")
    choice = choice.strip()
    target = target or job.hardware.gpu.name
    if choice == "none":
        why = "--calibration none: the default coefficients"
        return job, coef, {"id": None, "target": target, "why": why, "host_terms": host_terms(coef)}
    record, why = _record(choice, target, db)
    if record is None and target.startswith(GENERIC_PREFIX):
        why = "the job names no GPU model (--gpu-mem only); give --gpu to use the calibration of your GPU"
    if record is None:
        note = f"{why}: the default coefficients (planner calibrate fits them to probes)"
        return job, coef, {"id": None, "target": target, "why": note, "host_terms": host_terms(coef)}
    if record.version != CALIBRATION_VERSION:
        raise InputError(
            f"calibration {record.calibration_id} was fitted by another version of memplan's parameters "
            f"({record.version}, this one has {CALIBRATION_VERSION}): run planner calibrate again"
        )
    hardware = target_hardware(job.hardware, record.target)
    hardware, coef = apply_values(hardware, coef, record.values)
    held = record.report.get("errors", {}).get("held_out", {})
    block = {
        "id": record.calibration_id,
        "target": record.target,
        "device": record.fingerprint.get("name", ""),
        "created_at": record.created_at.isoformat(),
        "probes": len(record.probe_ids),
        "values": dict(record.values),
        "held_out_median_abs": {q: e.get("median_abs") for q, e in held.items()},
        # each host term measured on the probes' host, fitted, or assumed (calibrations before it: fitted or not)
        "host_terms": record.report.get("host_terms") or host_terms(coef, fitted=set(record.values)),
    }
    if record.target != target:
        block["note"] = f"fitted on {record.target}, applied to a job on {target}"
    return replace(job, hardware=hardware), coef, block


def calibration_line(block: dict[str, Any]) -> str:
    """One line for the text reports."""
    terms = f"; {host_terms_line(block['host_terms'])}" if block.get("host_terms") else ""
    if block.get("id") is None:
        return f"calibration: none for {block.get('target')} ({block.get('why')}){terms}"
    held = block.get("held_out_median_abs") or {}
    errors = ", ".join(f"{q} {v:.0%}" for q, v in held.items() if v is not None)
    suffix = f"; held-out median error {errors}" if errors else ""
    return (
        f"calibration: {block['id']} for {block['target']} from {block['probes']} probes "
        f"({block['created_at'][:10]}){suffix}{terms}"
    )
