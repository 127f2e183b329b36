"""Wall time and CPU seconds of the whole test suite (`make test`'s command), with its largest phases.

Target: under 20 minutes of wall time and under 2,400 CPU seconds on 2 cores, on a processor without oneDNN's bf16
kernels (`--no-bf16` sets ONEDNN_MAX_CPU_ISA=AVX2 to make one that has them behave so), the op build included
when the cache is empty (`--cold-ops` points TORCH_EXTENSIONS_DIR at an empty folder for the run). The suite's
own check (tests/cpu_budget.py) only catches one runaway phase; this is what holds its total speed.

The CPU seconds are the suite's and every process it waited for (pytest-xdist's workers, probes, their ranks,
compilers): `getrusage(RUSAGE_CHILDREN)` of this script after the run. The phases come from the suite's own
report (MEMPLAN_TEST_CPU_REPORT, tests/cpu_budget.py), which also says which worker ran each phase and when: the
summary gives each worker's busy time and when it ran its last test, the schedule's tail being the time the first
worker to finish then waited for the last (tests/schedule.py orders the modules to keep it short).

`--write-weights FILE` writes each module's CPU seconds in the report as the schedule's weight table
(tests/module_weights.json); `--from-report FILE.tsv` summarizes a kept report instead of running the suite;
`--replay WEIGHTS.json` replays the report's phases through xdist's hand-out in its own order and in the weights'
(benchmarks/suite_replay.py), to judge a weight table without a run.

Usage: .venv/bin/python benchmarks/suite_cpu.py [--workers 2] [--no-bf16] [--cold-ops] [--out FILE.md]
       [--report FILE.tsv] [--write-weights FILE.json] [--from-report FILE.tsv] [--replay WEIGHTS.json]
       [-- pytest args]
Prints a Markdown summary (and appends it to --out); exit 0 when the run passed within both targets, 1 otherwise
(with --from-report: 0).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

TARGET_WALL_S = 20 * 60
TARGET_CPU_S = 2400.0
TOP = 10
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.suite_replay import replay_lines  # noqa: E402


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass(frozen=True)
class Phase:
    """One line of the suite's report: a test phase, what it spent and, where the report says, where and when."""

    cpu_s: float
    nodeid: str
    when: str  # setup, call or teardown
    worker: str = ""  # pytest-xdist's worker id (gw0, ...), "main" without xdist, "" in an older report
    start: float = 0.0  # wall time, seconds since the epoch (0: not in the report)
    end: float = 0.0

    @property
    def name(self) -> str:
        return f"{self.nodeid} ({self.when})"

    @property
    def module(self) -> str:
        return self.nodeid.split("::", 1)[0]


def read_report(text: str) -> list[Phase]:
    """The report's phases in the order they were written (a report from before the worker and times: without)."""
    phases = []
    for line in text.splitlines():
        fields = line.split("\t")
        seconds, nodeid, when = fields[:3]
        if len(fields) >= 6:
            phases.append(Phase(float(seconds), nodeid, when, fields[3], float(fields[4]), float(fields[5])))
        else:
            phases.append(Phase(float(seconds), nodeid, when))
    return phases


def _largest(phases: list[Phase]) -> list[tuple[float, str]]:
    return sorted(((phase.cpu_s, phase.name) for phase in phases), reverse=True)


def module_cpu_s(phases: list[Phase]) -> dict[str, float]:
    """Each module's CPU seconds over its phases, heaviest first."""
    modules: dict[str, float] = defaultdict(float)
    for phase in phases:
        modules[phase.module] += phase.cpu_s
    return dict(sorted(modules.items(), key=lambda item: (-item[1], item[0])))


def weights_document(phases: list[Phase], source: str) -> dict[str, object]:
    """The schedule's weight table (tests/module_weights.json) from a report: each module's CPU seconds."""
    return {
        "source": source,
        "unit": "CPU seconds of the module's test phases (tests/cpu_budget.py's report); tests/schedule.py reads it",
        "modules": {module: round(seconds, 1) for module, seconds in module_cpu_s(phases).items()},
    }


def worker_lines(phases: list[Phase], run_start: float | None = None) -> list[str]:
    """A Markdown table of each worker's phases, CPU and busy seconds, and when it began its first and ended its
    last test phase (seconds from ``run_start``, else from the first phase's start), then the schedule's tail."""
    timed = [phase for phase in phases if phase.worker and phase.end > 0.0]
    if not timed:
        return []
    origin = run_start if run_start is not None else min(phase.start for phase in timed)
    workers: dict[str, list[Phase]] = defaultdict(list)
    for phase in timed:
        workers[phase.worker].append(phase)
    lines = [
        "| worker | phases | CPU s | busy s | first starts at s | last ends at s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    ends = []
    for worker, own in sorted(workers.items()):
        first, last = min(p.start for p in own) - origin, max(p.end for p in own) - origin
        ends.append(last)
        busy = sum(p.end - p.start for p in own)
        lines.append(
            f"| {worker} | {len(own)} | {sum(p.cpu_s for p in own):.0f} | {busy:.0f} | {first:.0f} | {last:.0f} |"
        )
    lines += ["", f"The tail: the first worker to finish waited {max(ends) - min(ends):.0f} s for the last.", ""]
    return lines


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _run_suite(args: argparse.Namespace) -> tuple[int, float, float, float, list[Phase]]:
    """Run `make test`'s command: its exit code, start (seconds since the epoch), wall and CPU seconds, phases."""
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
        run_start = time.time()
        start = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, env=env, check=False)
        wall_s = time.perf_counter() - start
        cpu_s = _children_cpu_s()
        text = report.read_text(encoding="utf-8") if report.exists() else ""
        if args.report is not None and report.exists():
            args.report.write_text(text, encoding="utf-8")
    return done.returncode, run_start, wall_s, cpu_s, read_report(text)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers (make test's TEST_WORKERS)")
    parser.add_argument("--no-bf16", action="store_true", help="ONEDNN_MAX_CPU_ISA=AVX2: no oneDNN bf16 kernels")
    parser.add_argument("--cold-ops", action="store_true", help="build DeepSpeed's ops in an empty folder")
    parser.add_argument("--out", type=Path, help="append the summary to this Markdown file")
    parser.add_argument("--report", type=Path, help="keep every phase's CPU seconds here (tab-separated)")
    parser.add_argument("--write-weights", type=Path, help="write the modules' CPU seconds as a schedule's weights")
    parser.add_argument("--from-report", type=Path, help="summarize this kept report; do not run the suite")
    parser.add_argument("--replay", type=Path, help="replay the phases in xdist's order and these weights' order")
    parser.add_argument("pytest_args", nargs="*", help="after --: passed to pytest")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)

    replay_weights = None
    if args.replay is not None:  # read before a run of many minutes, not after it
        try:
            document = json.loads(args.replay.read_text(encoding="utf-8"))
            replay_weights = {str(name): float(value) for name, value in document["modules"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            print(f"suite_cpu.py: cannot read the weights {args.replay}: {exc}", file=sys.stderr)
            return 2
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if args.from_report is not None:
        try:
            phases = read_report(args.from_report.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            print(f"suite_cpu.py: cannot read the report {args.from_report}: {exc}", file=sys.stderr)
            return 2
        ok, run_start = True, None
        head = [
            f"## {when}: the report {args.from_report}",
            "",
            f"- the test phases {sum(p.cpu_s for p in phases):.0f} CPU s, {len(phases)} phases",
        ]
        source = f"the report {args.from_report.name}, summarized {when}"
    else:
        returncode, started, wall_s, cpu_s, phases = _run_suite(args)
        ok, run_start = returncode == 0 and wall_s <= TARGET_WALL_S and cpu_s <= TARGET_CPU_S, started
        settings = ", ".join(
            s
            for s in (
                f"{args.workers} workers",
                "no oneDNN bf16" if args.no_bf16 else "",
                "cold op cache" if args.cold_ops else "",
            )
            if s
        )
        head = [
            f"## {when}: {_cpu_model()}, {os.cpu_count()} cores ({settings})",
            "",
            f"- exit {returncode}; wall {wall_s / 60:.1f} min (target {TARGET_WALL_S / 60:.0f}); "
            f"CPU {cpu_s:.0f} s (target {TARGET_CPU_S:.0f}); the test phases {sum(p.cpu_s for p in phases):.0f} s "
            f"of it, {len(phases)} phases",
        ]
        source = f"benchmarks/suite_cpu.py, {when}, {settings}"
    lines = [
        *head,
        "",
        "| CPU s | largest phases |",
        "|---:|---|",
        *(f"| {s:.1f} | `{name}` |" for s, name in _largest(phases)[:TOP]),
        "",
        "| CPU s | largest files |",
        "|---:|---|",
        *(f"| {s:.1f} | `{name}` |" for name, s in list(module_cpu_s(phases).items())[:TOP]),
        "",
        *worker_lines(phases, run_start),
    ]
    if replay_weights is not None:
        lines += replay_lines(phases, replay_weights, max(args.workers, 1))
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        with args.out.open("a", encoding="utf-8") as out:
            out.write(text + "\n")
    if args.write_weights is not None:
        document = weights_document(phases, source)
        partial = args.write_weights.with_name(args.write_weights.name + ".partial")
        partial.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
        partial.replace(args.write_weights)  # whole or not at all
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
