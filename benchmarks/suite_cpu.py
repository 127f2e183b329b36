"""Wall time and CPU seconds of the whole test suite (`make test`'s command), with its largest phases.

Target: under 20 minutes of wall time and under 2,400 CPU seconds on 2 cores, on a processor without oneDNN's bf16
kernels (`--no-bf16` sets ONEDNN_MAX_CPU_ISA=AVX2 to make one that has them behave so), the op build included
when the cache is empty (`--cold-ops` points TORCH_EXTENSIONS_DIR at an empty folder for the run). The suite's
own check (tests/cpu_budget.py) only catches one runaway phase; this is what holds its total speed.

The CPU seconds are the suite's and every process it waited for (pytest-xdist's workers, probes, their ranks,
compilers): `getrusage(RUSAGE_CHILDREN)` of this script after the run. The phases come from the suite's own
report (MEMPLAN_TEST_CPU_REPORT).

Usage: .venv/bin/python benchmarks/suite_cpu.py [--workers 2] [--no-bf16] [--cold-ops] [--out FILE.md]
       [--report FILE.tsv] [-- pytest args]
Prints a Markdown summary (and appends it to --out); exit 0 when the run passed within both targets, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

TARGET_WALL_S = 20 * 60
TARGET_CPU_S = 2400.0
TOP = 10
ROOT = Path(__file__).resolve().parent.parent


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _phases(report: Path) -> list[tuple[float, str]]:
    rows: list[tuple[float, str]] = []
    for line in report.read_text(encoding="utf-8").splitlines():
        seconds, nodeid, phase = line.split("\t")
        rows.append((float(seconds), f"{nodeid} ({phase})"))
    return sorted(rows, reverse=True)


def _by_file(rows: list[tuple[float, str]]) -> list[tuple[float, str]]:
    files: dict[str, float] = defaultdict(float)
    for seconds, name in rows:
        files[name.split("::")[0]] += seconds
    return sorted(((s, f) for f, s in files.items()), reverse=True)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers (make test's TEST_WORKERS)")
    parser.add_argument("--no-bf16", action="store_true", help="ONEDNN_MAX_CPU_ISA=AVX2: no oneDNN bf16 kernels")
    parser.add_argument("--cold-ops", action="store_true", help="build DeepSpeed's ops in an empty folder")
    parser.add_argument("--out", type=Path, help="append the summary to this Markdown file")
    parser.add_argument("--report", type=Path, help="keep every phase's CPU seconds here (tab-separated)")
    parser.add_argument("pytest_args", nargs="*", help="after --: passed to pytest")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="memplan-suite-") as temp:
        report = Path(temp) / "phases.tsv"
        env = {**os.environ, "MEMPLAN_TEST_CPU_REPORT": str(report), "DS_ACCELERATOR": "cpu"}
        if args.no_bf16:
            env["ONEDNN_MAX_CPU_ISA"] = "AVX2"
        if args.cold_ops:
            env["TORCH_EXTENSIONS_DIR"] = str(Path(temp) / "ops")
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args.pytest_args]
        if args.workers > 0:
            command += ["-n", str(args.workers), "--dist", "loadscope"]  # as `make test` runs it
        start = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, env=env, check=False)
        wall_s = time.perf_counter() - start
        cpu_s = _children_cpu_s()
        phases = _phases(report) if report.exists() else []
        if args.report is not None and report.exists():
            args.report.write_text(report.read_text(encoding="utf-8"), encoding="utf-8")

    ok = done.returncode == 0 and wall_s <= TARGET_WALL_S and cpu_s <= TARGET_CPU_S
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    settings = ", ".join(
        s
        for s in (
            f"{args.workers} workers",
            "no oneDNN bf16" if args.no_bf16 else "",
            "cold op cache" if args.cold_ops else "",
        )
        if s
    )
    lines = [
        f"## {when}: {_cpu_model()}, {os.cpu_count()} cores ({settings})",
        "",
        f"- exit {done.returncode}; wall {wall_s / 60:.1f} min (target {TARGET_WALL_S / 60:.0f}); "
        f"CPU {cpu_s:.0f} s (target {TARGET_CPU_S:.0f}); the test phases {sum(s for s, _ in phases):.0f} s of it, "
        f"{len(phases)} phases",
        "",
        "| CPU s | largest phases |",
        "|---:|---|",
        *(f"| {s:.1f} | `{name}` |" for s, name in phases[:TOP]),
        "",
        "| CPU s | largest files |",
        "|---:|---|",
        *(f"| {s:.1f} | `{name}` |" for s, name in _by_file(phases)[:TOP]),
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        with args.out.open("a", encoding="utf-8") as out:
            out.write(text + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
