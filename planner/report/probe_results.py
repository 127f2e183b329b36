"""The documents of measuring: ``probe``'s ``ProbeReport`` (its rows and extrapolations), ``calibrate``'s
``CalibrationReport`` and ``tune``'s ``TuneReport`` (``planner.report.results`` is the face).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from planner.report.plan_results import Plan
from planner.report.versioned import DOCUMENT, FROZEN, Versioned


def _relative(measured: float, predicted: float) -> float | None:
    return None if not measured else (predicted - measured) / measured


class ProbeRow(BaseModel):
    """One probe: what ran, what happened, measured beside predicted (relative error = pred/meas - 1)."""

    model_config = FROZEN

    probe_id: str
    strategy: dict[str, Any]
    label: str
    layers: int | None
    outcome: str
    failed_phase: str | None = None
    message: str = ""
    reused: bool = False
    measured: dict[str, Any] | None = None
    predicted: dict[str, Any]
    errors: dict[str, float | None] = {}
    world_size: int = 1  # ranks the probe ran
    worst_rank: int | None = None  # the rank with the largest step peak allocated (several ranks)

    @classmethod
    def from_probe(cls, item: Any, probe_id: str, result: Any, *, reused: bool, cpu_timed: bool = False) -> ProbeRow:
        """From a planned probe (strategy, layers, prediction) and its ProbeResult. ``cpu_timed``: the
        prediction used a calibration of this CPU, so a CPU probe's step time is compared too."""
        p = item.prediction
        predicted = {
            "peak_allocated_bytes": p.peak_allocated_bytes,
            "peak_reserved_bytes": p.peak_reserved_bytes,
            "step_time_s": p.step_time_s,
            "phases": [phase.to_dict() for phase in p.phases],
        }
        measured = None
        errors: dict[str, float | None] = {}
        if result.phases:
            measured = {
                "peak_allocated_bytes": result.peak_allocated_bytes,
                "peak_reserved_bytes": result.peak_reserved_bytes,
                "step_time_s": result.step_time_s,
                "host_rss_peak_bytes": result.host_rss_peak_bytes,
                "phases": [phase.to_dict() for phase in result.phases],
            }
        if result.outcome == "ok" and measured:
            # The time model is for GPUs: a CPU probe's step time says nothing about it, unless the model was
            # calibrated to this CPU's probes.
            on_cpu = getattr(getattr(item, "request", None), "device", None) == "cpu" and not cpu_timed
            errors = {
                "peak_allocated": _relative(measured["peak_allocated_bytes"], p.peak_allocated_bytes),
                "peak_reserved": _relative(measured["peak_reserved_bytes"], p.peak_reserved_bytes),
                "step_time": None if on_cpu else _relative(measured["step_time_s"], p.step_time_s),
            }
        depth = "" if item.layers is None else f" [{item.layers} layers]"
        return cls(
            probe_id=probe_id,
            strategy=item.strategy.to_dict(),
            label=(getattr(item, "label", "") or item.strategy.describe()) + depth,
            layers=item.layers,
            outcome=result.outcome,
            failed_phase=result.failed_phase,
            message=result.message,
            reused=reused,
            measured=measured,
            predicted=predicted,
            errors=errors,
            world_size=int(result.extra.get("world_size", 1)),
            worst_rank=result.extra.get("worst_rank"),
        )


class Extrapolation(BaseModel):
    """A strategy probed at two depths, extrapolated per layer to the full model."""

    model_config = FROZEN

    label: str
    depths: list[int]
    full_layers: int
    extrapolated: dict[str, float]  # per-layer line through the measured peaks: peak_allocated_bytes, ...
    predicted_full: dict[str, float]  # the cost model at full depth (the device's view of it)
    anchored: dict[str, float | None] = {}  # predicted_full plus the per-layer line of measured - predicted
    measured_full: dict[str, float] | None = None
    errors: dict[str, float | None] = {}  # extrapolated against measured full model
    anchored_errors: dict[str, float | None] = {}  # anchored against measured full model


class ProbeReport(Versioned):
    """What ``probe`` returns: every probe row, the per-layer extrapolations and the device."""

    model_config = DOCUMENT

    workload: dict[str, Any]
    hardware: dict[str, Any]
    device: str
    run_id: str
    fingerprint: dict[str, Any] | None = None
    rows: list[ProbeRow]
    extrapolations: list[Extrapolation] = []
    calibration: dict[str, Any] | None = None  # the calibration the predictions used (planner.job.calibrated)
    world_size: int = 1  # ranks each probe ran (measured figures are the worst rank's)
    notes: list[str] = []  # e.g. how a multi-node plan was probed on one node

    def to_json(self) -> str:
        return json.dumps(self.model_dump(), indent=2)


class CalibrationReport(BaseModel):
    """What ``calibrate`` returns: the device, every calibrated parameter before and after, and the errors.

    ``errors`` has ``before`` (the defaults), ``after`` (the fit, on the probes it saw) and ``held_out`` (each
    probe predicted by a fit to the others), each ``{quantity: {count, median_abs, worst}}`` with relative
    errors ``predicted / measured - 1``; quantity is ``time``, ``peak_allocated`` or ``peak_reserved``.
    """

    model_config = FROZEN

    calibration_id: str | None  # None when not saved
    target: str
    device: str
    fingerprint: dict[str, Any]
    observations: int
    probe_ids: list[str]
    skipped: list[str] = []
    parameters: list[dict[str, Any]]
    errors: dict[str, dict[str, dict[str, float]]]
    version: int
    # the time model's host terms: value, source (measured by the host benchmark, fitted, or assumed) and how
    host_terms: dict[str, dict[str, Any]] = {}
    host_benchmark: dict[str, Any] = {}  # what probes/measure/host_rates.py measured here (empty: it did not run)

    def to_json(self) -> str:
        return json.dumps(self.model_dump(), indent=2)


class TuneReport(Versioned):
    """What ``tune`` returns: the study, what was probed (by this run) and measured (by every run of the
    study), why it stopped, and the confirmed plan (saved, exportable) when a measured plan fits.

    ``rows`` are the measured candidates, fastest fitting first: ``strategy``, ``probe_id``, ``outcome``,
    ``fits`` (ran and stayed within the GPU budget), ``step_time_s`` and ``peak_reserved_bytes`` measured,
    ``noise`` (the probe's relative step-time spread), ``predicted_step_time_s`` (by the final calibration).
    """

    model_config = DOCUMENT

    study: str
    device: str
    target: str
    candidates: int
    probes_run: int
    device_seconds: float
    probes_measured: int
    stop_reason: str
    confirmed: bool
    calibration_id: str | None = None
    rows: list[dict[str, Any]] = []
    plan: Plan | None = None

    def to_json(self) -> str:
        return json.dumps(self.model_dump(), indent=2)
