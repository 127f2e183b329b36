"""Peak reserved on the GPU records: the fragment coefficients against the allocator replay of the built stream.

For every record of tests/data/gpu/, `planner.records_check` predicts through the public API (as
`benchmarks/shared_gpu_records.py` does); each prediction carries peak reserved twice: as the planner decides
with it (`search.step.fragments.apply_policy`, six named fragment coefficients) and from the replay of the
step's allocation stream, built from the cost model's bytes (`search.streams`), through the port of torch's
caching allocator (`search.allocator`; the report's `allocator_replay`). Prints both relative errors
(predicted / measured - 1) per record and phase. The replay's speed is `benchmarks/allocator_replay.py`'s.

    .venv/bin/python benchmarks/replay_vs_records.py [--records tests/data/gpu/h100-2026-11-23.json ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.records_check import compare_records  # noqa: E402

DEFAULT_RECORDS = sorted((Path(__file__).resolve().parents[1] / "tests" / "data" / "gpu").glob("*.json"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=Path, nargs="*", default=DEFAULT_RECORDS)
    args = parser.parse_args()
    if not args.records or any(not p.is_file() for p in args.records):
        print("no records at tests/data/gpu/", file=sys.stderr)
        return 2
    print("| record | scope | reserved, fragment coefficients | reserved, allocator replay |")
    print("|---|---|---|---|")
    for path in args.records:
        for c in compare_records(path):
            for scope, q in c.quantities.items():
                replay = q.get("replay_peak_reserved")
                cell = f"{replay.error:+.1%}" if replay else "-"
                print(f"| {c.record_id} | {scope} | {q['peak_reserved'].error:+.1%} | {cell} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
