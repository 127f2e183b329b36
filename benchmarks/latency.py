"""Wall time of `planner recommend` as a new process (target: 1.5 s median on a 2-core machine).

Usage: .venv/bin/python benchmarks/latency.py [--runs 7] [-- extra recommend args]
Writes nothing but a temporary database; prints each run and the median.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_ARGS = ["--model", "opt-1.3b", "--gpu-mem", "24G", "--workload", "sft", "--cpu-mem", "64G"]
TARGET_S = 1.5


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("extra", nargs="*", help="recommend arguments (default: the README's)")
    args = parser.parse_args()
    planner = Path(sys.executable).with_name("planner")
    command = [str(planner), "recommend", *(args.extra or DEFAULT_ARGS)]
    times: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PLANNER_DB=str(Path(tmp) / "bench.db"))
        subprocess.run(command, env=env, check=True, capture_output=True)  # creates the database once
        for i in range(args.runs):
            start = time.perf_counter()
            subprocess.run(command, env=env, check=True, capture_output=True)
            times.append(time.perf_counter() - start)
            print(f"run {i + 1}: {times[-1]:.3f} s")
    median = statistics.median(times)
    print(f"median {median:.3f} s over {args.runs} runs (target {TARGET_S} s): {' '.join(command[1:])}")
    return 0 if median <= TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
