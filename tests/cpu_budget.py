"""Every test's CPU budget: a slow new test is seen at once, on any processor, busy or not.

A test phase (setup, call or teardown) that spends more than ``MEMPLAN_TEST_CPU_BUDGET_S`` CPU seconds fails,
saying what it spent. CPU seconds are this process's and those of the children it has waited for (a probe's
spawned process, its ranks, a compiler building a DeepSpeed op), read from ``getrusage``: they do not grow when
another program shares the machine, as wall time would, so the check holds on a busy machine too. They do grow
when the work is slower, which is the point: a bf16 probe on a processor without oneDNN bf16 kernels spends one
to two orders of magnitude more of them (``ONEDNN_MAX_CPU_ISA=AVX2`` makes a processor that has the kernels
behave as one without, which is how the suite is timed for such processors; see docs/development.md).

The budget finds runaways, not slow machines. It is ``DEFAULT_BUDGET_S`` on a machine as fast as the reference
(a 2-core AMD EPYC with AVX2 only, no AVX-512 and no oneDNN bf16, where the largest phase spent 165 CPU seconds
in benchmarks/results/suite_cpu.md), times how much slower this machine runs a short reference workload
(:func:`reference_cpu_s`, timed once at session start, in the controlling process; pytest-xdist's workers read
the factor from ``MEMPLAN_TEST_CPU_FACTOR``). It is never below ``DEFAULT_BUDGET_S``: a faster machine keeps the
same limit. DeepSpeed's op builds are outside it: ``tests/op_builds.py`` builds them before the first test, and
fails a test that builds one. The suite's total speed is held by ``benchmarks/suite_cpu.py``, not by this check.
``MEMPLAN_TEST_CPU_BUDGET_S`` sets an absolute budget (not scaled); ``MEMPLAN_TEST_CPU_BUDGET_S=0`` turns it off.
The summary at the end names the phases that spent the most; ``MEMPLAN_TEST_CPU_REPORT=FILE`` also writes
every phase to FILE, one tab-separated line each: its CPU seconds, node id, phase, the pytest-xdist worker that ran
it (``main`` without xdist) and its start and end wall time (seconds since the epoch), to see where a suite's time
goes and how its workers shared it (``benchmarks/suite_cpu.py`` reads it).
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Generator
from typing import Any

import pytest

DEFAULT_BUDGET_S = 600.0  # on the reference machine: 3.6x its largest phase, an order of magnitude over most
REFERENCE_CPU_S = 0.20  # reference_cpu_s() on the reference machine (the least of five runs)
FACTOR_VARIABLE = "MEMPLAN_TEST_CPU_FACTOR"
TOP = 8
CPU_SECONDS = "cpu_seconds"  # the user property a phase's report carries its CPU seconds in
_spent_key = pytest.StashKey[dict[str, float]]()
_wall_key = pytest.StashKey[dict[str, tuple[float, float]]]()  # a phase's start and end, seconds since the epoch
_largest: list[tuple[float, str]] = []
_session: dict[str, Any] = {}
_wall_clock = time.time  # held here: a test that patches time.time does not move the report's times


_REFERENCE_SOURCE = "\n".join(
    f"def f{i}(a, b=2):\n    return [x * b for x in range(a)] + list({{'k': a}}.items())" for i in range(40)
)


def _reference_work() -> int:
    """What the suite mostly spends its CPU on, in small: the interpreter parsing, compiling and shuffling data."""
    rows = [{"name": f"layer{i}", "shape": [i, i + 1], "bytes": i * 4096} for i in range(2000)]
    size = 0
    for _ in range(12):
        back = json.loads(json.dumps(rows))
        back.sort(key=lambda row: (-row["bytes"], row["name"]))
        compile(_REFERENCE_SOURCE, "<reference>", "exec")
        size += sum(len(str(row)) for row in back)
    return size


def reference_cpu_s(repeats: int = 5) -> float:
    """CPU seconds of the reference workload on this machine: the least of ``repeats`` runs (about 0.2 s each on
    the reference machine), so that another program sharing the machine moves it little."""
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        _reference_work()
        best = min(best, time.process_time() - start)
    return best


def machine_factor() -> float:
    """How much slower than the reference machine this one is (never below 1): ``MEMPLAN_TEST_CPU_FACTOR`` where
    the controlling process set it, else timed here."""
    text = os.environ.get(FACTOR_VARIABLE, "").strip()
    if text:
        return max(1.0, float(text))
    return max(1.0, reference_cpu_s() / REFERENCE_CPU_S)


def budget_s(factor: float = 1.0) -> float:
    """The CPU seconds a test phase may spend (0: no budget): ``MEMPLAN_TEST_CPU_BUDGET_S`` as set, else
    ``DEFAULT_BUDGET_S`` times ``factor``."""
    text = os.environ.get("MEMPLAN_TEST_CPU_BUDGET_S", "")
    return float(text) if text.strip() else DEFAULT_BUDGET_S * factor


def pytest_configure(config: pytest.Config) -> None:
    """Read the budget and the report file once: a test's own environment changes do not move them. The
    controlling process times the machine once and hands the factor to its workers through the environment."""
    factor = machine_factor()
    os.environ[FACTOR_VARIABLE] = f"{factor:.3f}"
    _session["factor"] = factor
    _session["budget"] = budget_s(factor)
    _session["report"] = os.environ.get("MEMPLAN_TEST_CPU_REPORT") or None
    _session["worker"] = os.environ.get("PYTEST_XDIST_WORKER", "main")  # set by pytest-xdist in each worker


def cpu_seconds() -> float:
    """User and system CPU seconds of this process, of every child it has waited for, and of every probe child
    a preloaded starter forked for it and reaped (:func:`probes.process.preloaded.reaped_cpu_s`: those are the
    starter's children, which ``RUSAGE_CHILDREN`` here counts only when the starter ends)."""
    from probes.process.preloaded import reaped_cpu_s

    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime + reaped_cpu_s()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """End this process's preloaded starters, so that their CPU seconds reach the process that waits for it."""
    from probes.process.preloaded import close_all

    close_all()


def _measured(item: pytest.Item, phase: str) -> Generator[None, Any, None]:
    start = cpu_seconds()
    started_at = _wall_clock()
    try:
        yield
    finally:
        item.stash.setdefault(_spent_key, {})[phase] = cpu_seconds() - start
        item.stash.setdefault(_wall_key, {})[phase] = (started_at, _wall_clock())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, Any, None]:
    yield from _measured(item, "setup")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, None]:
    yield from _measured(item, "call")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, Any, None]:
    yield from _measured(item, "teardown")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    spent = item.stash.get(_spent_key, {}).get(call.when)
    if spent is None:
        return
    report.user_properties.append((CPU_SECONDS, spent))  # what the summary reads, in this process or xdist's
    report_file = _session.get("report")
    if report_file:
        started_at, ended_at = item.stash.get(_wall_key, {}).get(call.when, (0.0, 0.0))
        worker = _session.get("worker", "main")
        with open(report_file, "a", encoding="utf-8") as out:
            out.write(f"{spent:.2f}\t{item.nodeid}\t{call.when}\t{worker}\t{started_at:.3f}\t{ended_at:.3f}\n")
    limit = _session.get("budget", DEFAULT_BUDGET_S)
    if limit > 0 and spent > limit and report.outcome == "passed":
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} ({call.when}) spent {spent:.0f} CPU seconds, over the budget of {limit:.0f} "
            "(MEMPLAN_TEST_CPU_BUDGET_S): make it cheaper (a smaller model, fewer steps, the dtype this processor "
            "runs fast: see tests/cpu_dtype.py) or move what it measures to benchmarks/"
        )


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Keep the largest phases; under pytest-xdist the reports reach the controlling process with their
    ``user_properties``, so the summary covers every worker's tests."""
    spent = next((value for name, value in report.user_properties if name == CPU_SECONDS), None)
    if spent is None:
        return
    _largest.append((float(spent), f"{report.nodeid} ({report.when})"))
    _largest.sort(reverse=True)
    del _largest[TOP:]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _largest:
        return
    limit = _session.get("budget", DEFAULT_BUDGET_S)
    factor = _session.get("factor", 1.0)
    scaled = f", {factor:.2f} x the reference machine's {DEFAULT_BUDGET_S:.0f}" if factor > 1.0 else ""
    terminalreporter.section(f"CPU seconds: the largest test phases (budget {limit:.0f} s a phase{scaled})")
    for spent, name in _largest:
        terminalreporter.write_line(f"{spent:8.1f}  {name}")
