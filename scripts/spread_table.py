"""Write ``store/residuals.json``: every stored GPU record's residual of peak reserved memory and its mechanisms.

Each record of ``tests/data/gpu/*.json`` (the H100 file is the shared one, ``shared/gpu/h100-2026-11-23.json``,
copied unchanged) is predicted by the cost model with its own job and strategy
(:func:`planner.calibration.residuals.residual_table`); the table is what a plan's spread rests on
(:mod:`search.spread.measured`). Run it after a change to the cost model moves a record's prediction, or when a
records file is added: ``tests/planner/test_spread_records.py`` fails until the table is what this computes.

    DS_ACCELERATOR=cpu .venv/bin/python scripts/spread_table.py           # write the table
    DS_ACCELERATOR=cpu .venv/bin/python scripts/spread_table.py --check   # exit 1 when it is stale
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from planner.calibration.residuals import residual_table
from planner.files.atomic import write_json_atomic
from store.residuals import RESIDUALS_PATH

RECORDS = Path(__file__).resolve().parents[1] / "tests" / "data" / "gpu"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=Path, default=RECORDS, help="folder of records files (*.json)")
    parser.add_argument("--check", action="store_true", help="exit 1 when the shipped table is not what it computes")
    args = parser.parse_args(argv)
    table = residual_table(args.records)
    if args.check:
        shipped = json.loads(RESIDUALS_PATH.read_text(encoding="utf-8")) if RESIDUALS_PATH.is_file() else None
        if shipped != table:
            print(f"{RESIDUALS_PATH} is stale: run scripts/spread_table.py", file=sys.stderr)
            return 1
        return 0
    write_json_atomic(RESIDUALS_PATH, table, force=True)
    worst = min(table["records"], key=lambda row: row["residual"])
    print(f"wrote {RESIDUALS_PATH}: {len(table['records'])} records, worst {worst['record']} {worst['residual']:+.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
