"""Peak reserved on the GPU records: the prediction (the allocator replay) against the search's screen.

For every record of tests/data/gpu/, `planner.calibration.records` predicts through the public API (as
`benchmarks/shared_gpu_records.py` does). Each prediction's peak reserved comes from the replay of the step's
allocation stream, built from the cost model's bytes (`search.streams`), through the port of torch's caching
allocator (`search.allocator`), per phase; beside it, the peak reserved of the search's screen (six named
fragment coefficients, `search.step.fragments.apply_policy`, step-level: what a search ranks with before the
replay confirms). Prints both relative errors (predicted / measured - 1). The replay's speed is
`benchmarks/allocator_replay.py`'s.

    .venv/bin/python benchmarks/replay_vs_records.py [--records tests/data/gpu/h100-2026-11-23.json ...]
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
    if not args.records or any(not p.is_file() for p in args.records):
        print("no records at tests/data/gpu/", file=sys.stderr)
        return 2
    print("| record | scope | reserved, predicted (allocator replay) | reserved, search's screen (step) |")
    print("|---|---|---|---|")
    for path in args.records:
        for c in compare_records(path):
            screen = f"{c.screen_peak_reserved.error:+.1%}" if c.screen_peak_reserved else "-"
            for scope, q in c.quantities.items():
                print(f"| {c.record_id} | {scope} | {q['peak_reserved'].error:+.1%} | {screen} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
