"""Every test's CPU budget: a slow new test is seen at once, on any processor, busy or not.

A test phase (setup, call or teardown) that spends more than ``MEMPLAN_TEST_CPU_BUDGET_S`` CPU seconds fails,
saying what it spent. CPU seconds are this process's and those of the children it has waited for (a probe's
spawned process, its ranks, a compiler building a DeepSpeed op), read from ``getrusage``: they do not grow when
another program shares the machine, as wall time would, so the check holds on a busy machine too. They do grow
when the work is slower, which is the point: a bf16 probe on a processor without oneDNN bf16 kernels spends one
to two orders of magnitude more of them (``ONEDNN_MAX_CPU_ISA=AVX2`` makes a processor that has the kernels
behave as one without, which is how the suite is timed for such processors; see docs/development.md).

The default budget, 300 CPU seconds, is about 2.5 times the largest phase today on a 2-core machine (the first
accuracy probe with the planning of all its cases: 100 s, 123 s without oneDNN bf16 kernels; a fresh build of
DeepSpeed's CPU-Adam, about 120 s, where a test triggers it), and under half of what the accuracy probes spent in
one phase without the kernels before each test was charged its own probe (637 s).
``MEMPLAN_TEST_CPU_BUDGET_S=0`` turns it off.
The summary at the end names the phases that spent the most; ``MEMPLAN_TEST_CPU_REPORT=FILE`` also writes
every phase's CPU seconds to FILE (tab-separated), to see where a suite's time goes.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Generator
from typing import Any

import pytest

DEFAULT_BUDGET_S = 300.0
TOP = 8
CPU_SECONDS = "cpu_seconds"  # the user property a phase's report carries its CPU seconds in
_spent_key = pytest.StashKey[dict[str, float]]()
_largest: list[tuple[float, str]] = []
_session: dict[str, Any] = {}


def budget_s() -> float:
    """The CPU seconds a test phase may spend (0: no budget), as the environment says at session start."""
    text = os.environ.get("MEMPLAN_TEST_CPU_BUDGET_S", "")
    return float(text) if text.strip() else DEFAULT_BUDGET_S


def pytest_configure(config: pytest.Config) -> None:
    """Read the budget and the report file once: a test's own environment changes do not move them."""
    _session["budget"] = budget_s()
    _session["report"] = os.environ.get("MEMPLAN_TEST_CPU_REPORT") or None


def cpu_seconds() -> float:
    """User and system CPU seconds of this process and of every child it has waited for."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _measured(item: pytest.Item, phase: str) -> Generator[None, Any, None]:
    start = cpu_seconds()
    try:
        yield
    finally:
        item.stash.setdefault(_spent_key, {})[phase] = cpu_seconds() - start


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
        with open(report_file, "a", encoding="utf-8") as out:
            out.write(f"{spent:.2f}\t{item.nodeid}\t{call.when}\n")
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
    terminalreporter.section(f"CPU seconds: the largest test phases (budget {limit:.0f} s a phase)")
    for spent, name in _largest:
        terminalreporter.write_line(f"{spent:8.1f}  {name}")
