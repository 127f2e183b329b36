"""``python -m planner.schema [--write]``: check (exit 1 when stale) or regenerate the committed JSON Schemas."""

from __future__ import annotations

import argparse
import sys

from planner.schema import SCHEMA_VERSION, stale, write


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m planner.schema", description=__doc__)
    parser.add_argument("--write", action="store_true", help="regenerate planner/schema/*.schema.json")
    args = parser.parse_args(argv)
    if args.write:
        for path in write():
            print(f"wrote {path} (schema_version {SCHEMA_VERSION})")
        return 0
    behind = stale()
    if behind:
        print(f"stale: {', '.join(behind)}; run python -m planner.schema --write", file=sys.stderr)
        return 1
    print(f"the committed schemas are current (schema_version {SCHEMA_VERSION})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
