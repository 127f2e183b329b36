"""Turning probe rows into a report: the fingerprint and the per-layer extrapolation to full depth.

Two extrapolations from two cut depths K1 < K2 to the full depth L:

- per-layer line: the measured peaks through K1 and K2, read at L. Exact while the same moment sets the
  peak at every depth; off when it moves (a constant vocabulary-sized buffer at small depths, the
  optimizer step's per-layer copies at full depth).
- model-anchored: the cost model's full-depth prediction plus the measured-minus-predicted residual,
  itself a per-layer line through K1 and K2. The model supplies where the peak is; the probes correct its
  bytes per layer and its constant. Not computed for CPU step times (the time model is for GPUs).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from planner.job.inputs import ResolvedJob
from planner.probing.device import device_coefficients, device_prediction
from planner.report.results import Extrapolation, ProbeReport, ProbeRow
from search import DEFAULT_COEFFICIENTS, Coefficients, predict
from store.records import RLHFStrategy, Strategy

METRICS = ("peak_allocated_bytes", "peak_reserved_bytes", "step_time_s")


def extrapolate(depths: tuple[int, int], values: tuple[float, float], layers: int) -> float:
    """Straight line through two depths, read at ``layers``: memory and time grow per decoder layer."""
    (k1, k2), (v1, v2) = depths, values
    return v2 + (v2 - v1) / (k2 - k1) * (layers - k2)


def build_report(
    job: ResolvedJob,
    device: str,
    run_id: str,
    rows: list[ProbeRow],
    fingerprint: dict[str, Any] | None = None,
    coefficients: Coefficients = DEFAULT_COEFFICIENTS,
    notes: list[str] | None = None,
) -> ProbeReport:
    """Rows plus, for each strategy probed ok at two or more cut depths, the extrapolation to full depth,
    predicted with ``coefficients`` (those the probes' own predictions used), and ``notes`` for the reader.
    ``job`` is what the probes ran (one node of a multi-node plan)."""
    by_strategy: dict[str, list[ProbeRow]] = defaultdict(list)
    for row in rows:
        by_strategy[repr(sorted(row.strategy.items()))].append(row)
    extrapolations = [
        e for e in (_extrapolation(job, device, coefficients, group) for group in by_strategy.values()) if e is not None
    ]
    return ProbeReport(
        workload=job.workload.to_dict(),
        hardware=job.hardware.to_dict(),
        device=device,
        run_id=run_id,
        fingerprint=fingerprint,
        rows=rows,
        extrapolations=extrapolations,
        world_size=job.hardware.world_size,
        notes=list(notes or []),
    )


def _extrapolation(
    job: ResolvedJob, device: str, coefficients: Coefficients, group: list[ProbeRow]
) -> Extrapolation | None:
    """The probes of one strategy extrapolated per layer to the full depth (None: fewer than two cut depths ran
    ok): the measured line, and the prediction at full depth anchored by the line of measured - predicted."""
    full_layers = job.workload.model.num_layers
    cut = sorted((r for r in group if r.layers is not None and r.outcome == "ok"), key=lambda r: r.layers or 0)
    if len(cut) < 2:
        return None
    low, high = cut[0], cut[-1]
    depths = (int(low.layers or 0), int(high.layers or 0))
    assert low.measured is not None and high.measured is not None
    extrapolated = {
        m: extrapolate(depths, (float(low.measured[m]), float(high.measured[m])), full_layers) for m in METRICS
    }
    parse = RLHFStrategy.from_dict if job.workload.is_rlhf else Strategy.from_dict
    full_prediction = device_prediction(
        predict(job.workload, parse(group[0].strategy), job.hardware, device_coefficients(device, coefficients)),
        device,
    )
    predicted_full = {m: float(getattr(full_prediction, m)) for m in METRICS}
    anchored: dict[str, float | None] = {}
    for m in METRICS:
        if device == "cpu" and m == "step_time_s":
            anchored[m] = None
            continue
        residuals = (
            float(low.measured[m]) - float(low.predicted[m]),
            float(high.measured[m]) - float(high.predicted[m]),
        )
        anchored[m] = predicted_full[m] + extrapolate(depths, residuals, full_layers)
    full_row = next((r for r in group if r.layers is None and r.outcome == "ok"), None)
    measured_full = {m: float(full_row.measured[m]) for m in METRICS} if full_row and full_row.measured else None
    return Extrapolation(
        label=low.label.rsplit(" [", 1)[0],
        depths=list(depths),
        full_layers=full_layers,
        extrapolated=extrapolated,
        predicted_full=predicted_full,
        anchored=anchored,
        measured_full=measured_full,
        errors=_errors(dict(extrapolated), measured_full),
        anchored_errors=_errors(anchored, measured_full),
    )


def _errors(values: dict[str, float | None], measured_full: dict[str, float] | None) -> dict[str, float | None]:
    """Each value against the full model's measured one (value / measured - 1); none without a full-depth probe."""
    if not measured_full:
        return {}
    return {
        m: value / measured_full[m] - 1 if (measured_full[m] and value is not None) else None
        for m, value in values.items()
    }
