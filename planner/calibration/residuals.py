"""The residual table a plan's spread rests on, computed from the stored GPU records (``store/residuals.json``).

Every record of each records file (``tests/data/gpu/*.json``) is predicted with its own job and strategy
(:func:`planner.calibration.records.compare_records`); a record's residual is its worst scope's
``predicted / measured - 1`` of peak reserved (an SFT loop row's whole step, a probe's worst phase), beside the
mechanisms its plan runs (``Prediction.reserved_spread_basis["kind"]``, :func:`search.spread.kinds.kind_of`).
``scripts/spread_table.py`` writes the table; a test recomputes it and compares.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from planner.calibration.records import RecordComparison, compare_records
from store.residuals import Residual, residuals_document


def record_residuals(paths: Iterable[Path], compared_records: list[RecordComparison] | None = None) -> list[Residual]:
    """One residual per record that measured a peak reserved, in file and record order (``compared_records``:
    the comparisons of a single path, already made)."""
    rows: list[Residual] = []
    for path in paths:
        for compared in compare_records(path) if compared_records is None else compared_records:
            scopes = [(scope, q["peak_reserved"]) for scope, q in compared.quantities.items() if "peak_reserved" in q]
            if not scopes or not compared.spread_basis:
                continue
            scope, worst = min(scopes, key=lambda entry: entry[1].error)
            rows.append(
                Residual(
                    record=f"{path.name}:{compared.record_id}",
                    source=compared.kind,
                    workload=compared.workload,
                    model=compared.model,
                    gpu=compared.gpu,
                    kind=dict(compared.spread_basis["kind"]),
                    scope=scope,
                    measured_reserved_bytes=int(worst.measured),
                    predicted_reserved_bytes=int(worst.predicted),
                )
            )
    return rows


def residual_table(folder: Path) -> dict[str, Any]:
    """The ``residuals.json`` document of every records file in ``folder`` (``*.json``, sorted by name)."""
    paths = sorted(folder.glob("*.json"))
    return residuals_document(record_residuals(paths), [path.name for path in paths])
