"""Every stored GPU record inside its plan's spread, and the shipped residual table what the script computes
(issue 46 A: store/residuals.json from tests/data/gpu/*.json by scripts/spread_table.py).

Each record is predicted once (``planner.calibration.records.compare_records``, its own job and strategy on the
catalog GPU its fingerprint names); its plan's spread comes from the shipped table (search.spread.measured).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.calibration.records import RecordComparison, compare_records
from planner.calibration.residuals import record_residuals
from store.residuals import RESIDUALS_PATH, residuals_document

FOLDER = Path(__file__).resolve().parents[1] / "data" / "gpu"
RECORDS = sorted(FOLDER.glob("*.json"))
COMPARED: dict[Path, list[RecordComparison]] = {path: compare_records(path) for path in RECORDS}
SHIPPED = json.loads(RESIDUALS_PATH.read_text(encoding="utf-8"))


def _cases() -> list[object]:
    return [
        pytest.param(c, scope, id=f"{path.name}-{c.record_id}-{scope}")
        for path, compared in COMPARED.items()
        for c in compared
        for scope, quantities in c.quantities.items()
        if "peak_reserved" in quantities
    ]


@pytest.mark.parametrize(("compared", "scope"), _cases())
def test_measured_reserved_lies_inside_the_plans_spread(compared: RecordComparison, scope: str) -> None:
    reserved = compared.quantities[scope]["peak_reserved"]
    basis = compared.spread_basis or {}
    assert basis.get("near"), f"no measured record near {compared.record_id}'s own kind: {basis}"
    assert reserved.measured <= reserved.predicted * (1 + compared.reserved_spread), (
        f"measured {reserved.measured / 2**30:.2f} GiB over predicted {reserved.predicted / 2**30:.2f} GiB "
        f"+ {compared.reserved_spread:.1%} ({basis.get('records')})"
    )


def test_each_record_rests_on_its_own_kind() -> None:
    """A stored record is of its own kind: its plan's spread rests on records that include it (distance 0)."""
    for path, compared in COMPARED.items():
        for c in compared:
            basis = c.spread_basis or {}
            assert basis["distance"] == 0 and f"{path.name}:{c.record_id}" in basis["records"], c.record_id
            assert basis["count"] == len(basis["records"]) >= 1


def test_the_shipped_table_is_what_the_script_computes_from_the_records() -> None:
    """Regenerated from the records (the predictions above, no second prediction) and compared: record ids,
    mechanisms and measured bytes exactly, the predictions to 0.05% (run scripts/spread_table.py when a change
    to the cost model moves one further)."""
    residuals = [row for path in RECORDS for row in record_residuals([path], COMPARED[path])]
    computed = residuals_document(residuals, [path.name for path in RECORDS])
    assert computed["sources"] == SHIPPED["sources"]
    assert len(computed["records"]) == len(SHIPPED["records"])
    for mine, shipped in zip(computed["records"], SHIPPED["records"], strict=True):
        exact = {k: v for k, v in mine.items() if k not in ("predicted_reserved_bytes", "residual", "scope")}
        assert exact == {k: shipped[k] for k in exact}, "store/residuals.json is stale: run scripts/spread_table.py"
        assert mine["residual"] == pytest.approx(shipped["residual"], abs=5e-4), (
            f"{mine['record']}: {shipped['residual']:+.2%} shipped, {mine['residual']:+.2%} now: run "
            "scripts/spread_table.py"
        )
