"""Wall time of `planner recommend` for a local config of an architecture without a formula: first use
(transformers reads the module tree and traces the activations on the meta device) and cached use.

Targets (issue "Traced model costs", part 6): first use under 20 s on a 2-core machine, with a progress line;
cached use adds nothing measurable (compared with the same model from the catalog, whose shape ships as
package data). Each model's catalog config is written to a fresh folder and planned against a fresh
database, so the first run really traces.

Usage: .venv/bin/python benchmarks/trace_latency.py [--models qwen3-30b-a3b,gemma-3-4b] [--runs 3]
Prints a Markdown table: first use, then the median of the cached runs and of the catalog name's runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from store.models import catalog_configs  # noqa: E402

ARGS = ["--gpu-mem", "80G", "--cpu-mem", "256G", "--workload", "sft"]


def _run(model: str, db: Path) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "planner", "recommend", "--model", model, *ARGS, "--db", str(db)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return time.perf_counter() - started, done.stderr


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="qwen3-30b-a3b,gemma-3-4b")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    configs = catalog_configs()
    print("| model | first use (s) | cached, median (s) | catalog name, median (s) | progress line on first use |")
    print("|---|---|---|---|---|")
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / name
            folder.mkdir()
            (folder / "config.json").write_text(json.dumps(configs[name]))
            db = Path(tmp) / "plans.db"
            first, said = _run(str(folder), db)
            cached = [_run(str(folder), db)[0] for _ in range(args.runs)]
            catalog = [_run(name, db)[0] for _ in range(args.runs)]
        line = "yes" if "on the meta device" in said else "no"
        print(
            f"| {name} | {first:.2f} | {statistics.median(cached):.2f} | {statistics.median(catalog):.2f} | {line} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
