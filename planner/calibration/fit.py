"""``planner.calibrate``: fit the cost model's coefficients to the probes stored for one device, and keep
the fit in the database with the probes it came from.

Reads top to bottom: gather the stored probes (and the records files given) of one device, rebuild each
probe's job, fit (:func:`search.calibration.calibrate`: bounded least squares on log relative errors, each
observation held out in turn), save, report every parameter and the errors before, after and held out.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from planner.calibration.gather import (
    Gathered,
    gather,
    loop_row_observation,
    records_file_entries,
    stored_entries,
)
from planner.job.host_cache import cache_path, expires_at, keep, kept, kept_rate, measured_at
from planner.job.host_terms import HOST_TERMS, host_terms
from planner.job.target import detected_target, target_of
from planner.report.results import CalibrationReport
from search import DEFAULT_COEFFICIENTS, Coefficients
from search.calibration import CALIBRATION_VERSION, PARAMETERS, CalibrationFit, Observation
from search.calibration import calibrate as fit_calibration
from store.db import open_storage
from store.errors import InputError

HOST_BENCHMARK = "host_benchmark"  # the kept section of this host's benchmark (planner.job.host_cache)


def calibrate(
    *,
    device_fingerprint: str | None = None,
    records: Sequence[str] = (),
    db: str | None = None,
    held_out: bool = True,
    save: bool = True,
    coefficients: Coefficients = DEFAULT_COEFFICIENTS,
    host_benchmark: bool = True,
) -> CalibrationReport:
    """Fit the calibrated coefficients (:data:`search.calibration.PARAMETERS`) to the finished probes of one
    device, stored in ``db`` (and in the ``records`` files given: ``tests/data/gpu``'s shape).

    ``device_fingerprint`` picks the device: a target name (``H100-80G``, ``cpu:<model>``) or a word of its
    device name; None takes the only device there is, or this machine's (its GPU, else its CPU) among
    several. ``held_out`` predicts each observation by a fit without it (leave-one-out) to report the error
    on probes the fit did not see. The calibration is saved unless
    ``save`` is False; ``recommend``, ``predict``, ``check`` and ``probe`` then use it for that device.
    ``host_benchmark``: where the device is this machine's, measure its host terms first
    (``probes/measure/host_rates.py``, about a second, once per host: kept by :mod:`planner.job.host_cache`): the
    fit starts from them, and those it does not determine are stored as measured (:mod:`planner.job.host_terms`;
    each term measured, fitted or assumed).
    """

    gathered, observations, skipped = _observations(records, db, device_fingerprint)
    measured, benchmark = _host_rates(gathered.target, host_benchmark)
    coefficients = coefficients.with_(**measured)
    try:
        fit = fit_calibration(observations, coefficients, leave_one_out=held_out)
    except ValueError as exc:
        raise InputError(f"cannot calibrate {gathered.target}: {exc}") from None
    labels = [obs.label for obs in observations]
    fitted_coefficients = coefficients.with_(**{k: v for k, v in fit.values.items() if k in HOST_TERMS})
    terms = host_terms(fitted_coefficients, measured, set(fit.values), benchmark.get("why_not"))
    values = {**measured, **fit.values}
    report = fit.to_dict() | {"host_terms": terms, "host_benchmark": benchmark}
    calibration_id = None
    if save:
        with open_storage(db) as storage:
            record = storage.save_calibration(
                target=gathered.target,
                device=gathered.device,
                version=CALIBRATION_VERSION,
                fingerprint=gathered.fingerprint,
                values=values,
                probe_ids=labels,
                report=report,
            )
            calibration_id = record.calibration_id
    return CalibrationReport(
        calibration_id=calibration_id,
        target=gathered.target,
        device=gathered.device,
        fingerprint=gathered.fingerprint,
        observations=fit.observations,
        probe_ids=labels,
        skipped=skipped,
        parameters=_parameters(fit),
        errors=fit.to_dict()["errors"],
        version=CALIBRATION_VERSION,
        host_terms=terms,
        host_benchmark=benchmark,
    )


def _observations(
    records: Sequence[str], db: str | None, device_fingerprint: str | None
) -> tuple[Gathered, list[Observation], list[str]]:
    """The device's stored probes and the records files' probes and loop rows, each rebuilt into an observation
    of its job; what could not be rebuilt, one line each. InputError when nothing could."""
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
    return gathered, observations, skipped


def _parameters(fit: CalibrationFit) -> list[dict[str, Any]]:
    """Every calibrated parameter: what it is, its default, its fitted value and whether the probes determine it."""
    return [
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


def _host_rates(target: str, run: bool, now: datetime | None = None) -> tuple[dict[str, float], dict[str, Any]]:
    """(the host terms measured on this machine, the benchmark's report) where ``target`` is this machine's
    device and ``run``; else nothing measured and why. This host's benchmark is run once and kept
    (:mod:`planner.job.host_cache`, read and written at ``now``, default the clock's); the report's ``source``
    says whether it ran now or where it was kept, and ``host_rates`` says it in the line the report prints
    (``measured now`` or ``from the cache of DATE (expires DATE)``, ISO UTC), with ``measured_at`` and
    ``expires_at``."""
    if not run:
        return {}, {"why_not": dict.fromkeys(HOST_TERMS, "the host benchmark was not run (host_benchmark=False)")}
    here = detected_target()
    if target != here:
        why = f"not measured: calibrating {target} on another machine ({here}), whose host is not its host"
        return {}, {"why_not": dict.fromkeys(HOST_TERMS, why)}
    held = kept(HOST_BENCHMARK, now)
    rates_held = held.get("measured")
    if isinstance(rates_held, dict) and rates_held and all(kept_rate(v) is not None for v in rates_held.values()):
        where = f"kept in {cache_path()} (measured {measured_at(held)}; delete the file to measure again)"
        when = {"measured_at": measured_at(held), "expires_at": expires_at(held)}
        line = f"from the cache of {when['measured_at']} (expires {when['expires_at']})"
        return dict(rates_held), {k: v for k, v in held.items() if k != "measured_at"} | {
            "source": where, "host_rates": line, **when
        }  # fmt: skip
    from probes.measure.host_rates import measure_host_rates

    moment = datetime.now(UTC) if now is None else now
    rates = measure_host_rates()
    keep(HOST_BENCHMARK, rates.to_dict(), moment)
    held = kept(HOST_BENCHMARK, moment)  # {} where the cache folder could not keep it
    when = {"measured_at": moment.isoformat(timespec="seconds"), "expires_at": expires_at(held) if held else "now"}
    line = f"measured now (kept in the cache until {when['expires_at']})" if held else "measured now (not kept)"
    return rates.measured(), rates.to_dict() | {"source": "measured now", "host_rates": line, **when}
