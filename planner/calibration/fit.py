"""``planner.calibrate``: fit the cost model's coefficients to the probes stored for one device, and keep
the fit in the database with the probes it came from.

Reads top to bottom: gather the stored probes (and the records files given) of one device, rebuild each
probe's job, fit (:func:`search.calibration.calibrate`: bounded least squares on log relative errors, each
observation held out in turn), save, report every parameter and the errors before, after and held out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from planner.calibration.gather import (
    gather,
    loop_row_observation,
    records_file_entries,
    stored_entries,
    target_of,
)
from planner.job.target import detected_target
from planner.report.results import CalibrationReport
from search import DEFAULT_COEFFICIENTS, Coefficients
from search.calibration import CALIBRATION_VERSION, PARAMETERS
from search.calibration import calibrate as fit_calibration
from store.db import open_storage
from store.errors import InputError


def calibrate(
    *,
    device_fingerprint: str | None = None,
    records: Sequence[str] = (),
    db: str | None = None,
    held_out: bool = True,
    save: bool = True,
    coefficients: Coefficients = DEFAULT_COEFFICIENTS,
) -> CalibrationReport:
    """Fit the calibrated coefficients (:data:`search.calibration.PARAMETERS`) to the finished probes of one
    device, stored in ``db`` (and in the ``records`` files given: ``tests/data/gpu``'s shape).

    ``device_fingerprint`` picks the device: a target name (``H100-80G``, ``cpu:<model>``) or a word of its
    device name; None takes the only device there is, or this machine's (its GPU, else its CPU) among
    several. ``held_out`` predicts each observation by a fit without it (leave-one-out) to report the error
    on probes the fit did not see. The calibration is saved unless
    ``save`` is False; ``recommend``, ``predict``, ``check`` and ``probe`` then use it for that device.
    """

    entries: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
    loop_rows: list[dict[str, Any]] = []
    for path in records:
        probes, rows = records_file_entries(path)
        entries.extend(probes)
        loop_rows.extend(rows)
    entries.extend(stored_entries(db))

    gathered = gather(entries, device_fingerprint, detected_target() if device_fingerprint is None else None, db)
    observations = list(gathered.observations)
    skipped = list(gathered.skipped)
    for row in loop_rows:
        if target_of(row.get("device"))[0] != gathered.target:
            continue
        try:
            observations.append(loop_row_observation(row, gathered.target, db))
        except (InputError, KeyError, TypeError, ValueError) as exc:
            skipped.append(f"{row.get('id')}: cannot rebuild its job ({exc})")
    if not observations:
        raise InputError(f"no probe of {gathered.target} could be rebuilt to calibrate from: {'; '.join(skipped)}")
    try:
        fit = fit_calibration(observations, coefficients, leave_one_out=held_out)
    except ValueError as exc:
        raise InputError(f"cannot calibrate {gathered.target}: {exc}") from None
    labels = [obs.label for obs in observations]
    calibration_id = None
    if save:
        with open_storage(db) as storage:
            record = storage.save_calibration(
                target=gathered.target,
                device=gathered.device,
                version=CALIBRATION_VERSION,
                fingerprint=gathered.fingerprint,
                values=fit.values,
                probe_ids=labels,
                report=fit.to_dict(),
            )
            calibration_id = record.calibration_id
    parameters = [
        {
            "name": p.name,
            "what": p.what,
            "moves": p.moves,
            "default": fit.defaults[p.name],
            "value": fit.values.get(p.name, fit.defaults[p.name]),
            "sensitivity": fit.sensitivity[p.name],
            "determined": p.name in fit.values,
        }
        for p in PARAMETERS
    ]
    return CalibrationReport(
        calibration_id=calibration_id,
        target=gathered.target,
        device=gathered.device,
        fingerprint=gathered.fingerprint,
        observations=fit.observations,
        probe_ids=labels,
        skipped=skipped,
        parameters=parameters,
        errors=fit.to_dict()["errors"],
        version=CALIBRATION_VERSION,
    )
