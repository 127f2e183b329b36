"""Wall time of `planner recommend` as a new process, against `python -c pass` in the same run.

Target: 1.5 s median for each command on a 2-core machine. The commands run round-robin (pass, sft, ppo,
pass, sft, ...) so that load from other work lands on all of them alike; the ratio to `python -c pass`
shows how much of a slow run is the machine. Each process gets a fresh bytecode cache in a temporary
folder (PYTHONPYCACHEPREFIX), filled by one warm-up run per command: the figures are those of an
installed memplan, not of a checkout whose __pycache__ is stale or cannot be written.

Usage: .venv/bin/python benchmarks/latency.py [--runs 9] [--out benchmarks/results/latency.json] [-- extra args]
Extra args are appended to both recommend commands (e.g. `-- --cpu-mem 64G`). Prints a Markdown table and
writes the figures as JSON; exit 0 when both medians are within the target, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

TARGET_S = 1.5
RESULTS = Path(__file__).resolve().parent / "results" / "latency.json"
RECOMMEND = ["recommend", "--model", "opt-1.3b", "--gpu-mem", "24G"]
COMMANDS: dict[str, list[str]] = {
    "sft": [*RECOMMEND, "--workload", "sft"],
    "ppo": RECOMMEND,  # the default workload
}


def _argv(name: str, extra: list[str]) -> list[str]:
    if name == "pass":
        return [sys.executable, "-c", "pass"]
    return [str(Path(sys.executable).with_name("planner")), *COMMANDS[name], *extra]


def _time(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system) of one process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(runs: int, extra: list[str]) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """(wall, CPU) seconds of each run of each command (``pass`` first in every round)."""
    wall: dict[str, list[float]] = {name: [] for name in ("pass", *COMMANDS)}
    cpu: dict[str, list[float]] = {name: [] for name in wall}
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PLANNER_DB=str(Path(tmp) / "bench.db"), PYTHONPYCACHEPREFIX=str(Path(tmp) / "pyc"))
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        for name in wall:  # warm-up: fills the bytecode cache, creates the database
            _time(_argv(name, extra), env)
        for _ in range(runs):
            for name in wall:
                seconds, busy = _time(_argv(name, extra), env)
                wall[name].append(seconds)
                cpu[name].append(busy)
    return wall, cpu


def summary(times: dict[str, list[float]], cpu: dict[str, list[float]], extra: list[str]) -> dict[str, Any]:
    """Medians, ratios to `python -c pass` (of the medians and the median of per-round ratios), verdicts.

    CPU time (user + system) moves far less with the load of other work than wall time does.
    """
    base = statistics.median(times["pass"])
    rows: dict[str, dict[str, Any]] = {}
    for name in COMMANDS:
        median = statistics.median(times[name])
        per_round = [t / p for t, p in zip(times[name], times["pass"], strict=True)]
        rows[name] = {
            "command": "planner " + " ".join(COMMANDS[name] + extra),
            "median_s": round(median, 3),
            "min_s": round(min(times[name]), 3),
            "max_s": round(max(times[name]), 3),
            "cpu_median_s": round(statistics.median(cpu[name]), 3),
            "ratio_to_pass": round(median / base, 1),
            "median_round_ratio": round(statistics.median(per_round), 1),
            "within_target": median <= TARGET_S,
        }
    return {
        "when": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}",
        "runs": len(times["pass"]),
        "target_s": TARGET_S,
        "python_c_pass_median_s": round(base, 3),
        "python_c_pass_cpu_median_s": round(statistics.median(cpu["pass"]), 3),
        "commands": rows,
        "times_s": {name: [round(t, 3) for t in values] for name, values in times.items()},
        "cpu_s": {name: [round(t, 3) for t in values] for name, values in cpu.items()},
    }


def markdown(result: dict[str, Any]) -> str:
    """The summary as a Markdown table."""
    lines = [
        f"{result['when']} · {result['machine']} · {result['runs']} runs each, round-robin · "
        f"`python -c pass` median {result['python_c_pass_median_s']:.3f} s "
        f"(CPU {result['python_c_pass_cpu_median_s']:.3f} s)",
        "",
        "| command | median | min | max | CPU median | x `python -c pass` | within 1.5 s |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in result["commands"].values():
        lines.append(
            f"| `{row['command']}` | {row['median_s']:.3f} s | {row['min_s']:.3f} s | {row['max_s']:.3f} s | "
            f"{row['cpu_median_s']:.3f} s | "
            f"{row['ratio_to_pass']:.1f} (rounds: {row['median_round_ratio']:.1f}) | "
            f"{'yes' if row['within_target'] else 'no'} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the figures (JSON)")
    parser.add_argument("extra", nargs="*", help="arguments appended to both recommend commands")
    args = parser.parse_args()
    wall, cpu = measure(args.runs, args.extra)
    result = summary(wall, cpu, args.extra)
    print(markdown(result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0 if all(row["within_target"] for row in result["commands"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
