"""Predicted against measured for the GPU records in tests/data/gpu/ (SFT rows and every finished probe).

Each record goes through the public API (`planner.calibration.records`: `check` with a row's exact ds_config,
`predict` with a probe's strategy) on the catalog GPU its fingerprint names; prints the relative error
(predicted / measured - 1) of peak allocated, peak reserved and time, per step (SFT rows) or per phase
(probes), and the term the time model says dominates.

    .venv/bin/python benchmarks/shared_gpu_records.py [--records tests/data/gpu/h100-2026-11-23.json ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.calibration.records import compare_records  # noqa: E402

DEFAULT_RECORDS = sorted((Path(__file__).resolve().parents[1] / "tests" / "data" / "gpu").glob("*.json"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=Path, nargs="*", default=DEFAULT_RECORDS)
    args = parser.parse_args()
    missing = [path for path in args.records if not path.is_file()]
    if missing or not args.records:
        print(f"no records at {missing or 'tests/data/gpu/'}", file=sys.stderr)
        return 2
    print("| record | scope | peak allocated | peak reserved | time | dominant time term |")
    print("|---|---|---|---|---|---|")
    compared = [c for path in args.records for c in compare_records(path)]
    for c in compared:
        for scope, q in c.quantities.items():
            cells = [f"{q[name].error:+.1%}" for name in ("peak_allocated", "peak_reserved")]
            cells.append(f"{q['time'].error:+.1%}" if c.time_comparable else f"({q['time'].error:+.0%}: not steady)")
            print(f"| {c.record_id} | {scope} | " + " | ".join(cells) + f" | {c.dominant_time_term} |")
    for c in compared:
        if not c.time_comparable:
            print(f"\n{c.record_id}: times not compared: {c.why_not_timed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
