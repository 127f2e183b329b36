"""The suite's CPU budget check (tests/cpu_budget.py), run on a small suite of its own: a test phase that
spends more CPU seconds than the budget fails, naming what it spent, counting the children it waited for."""

from __future__ import annotations

from pathlib import Path

import pytest

BURNING_TESTS = """
import subprocess
import sys
import time


def burn(seconds):
    start = time.process_time()
    while time.process_time() - start < seconds:
        pass


def test_cheap():
    burn(0.05)


def test_costly():
    burn(1.5)


def test_costly_child():
    code = "import time\\nstart = time.process_time()\\nwhile time.process_time() - start < 1.5: pass"
    subprocess.run([sys.executable, "-c", code], check=True)
"""


def _run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, budget: str) -> pytest.RunResult:
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parent))
    monkeypatch.setenv("MEMPLAN_TEST_CPU_BUDGET_S", budget)
    monkeypatch.delenv("MEMPLAN_TEST_CPU_REPORT", raising=False)
    pytester.makeconftest('pytest_plugins = ["cpu_budget"]\n')
    pytester.makepyfile(test_burning=BURNING_TESTS)
    return pytester.runpytest_subprocess("-p", "no:cacheprovider")


def test_a_test_over_the_cpu_budget_fails_saying_what_it_spent(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = _run(pytester, monkeypatch, "0.75")
    result.assert_outcomes(passed=1, failed=2)
    text = result.stdout.str()
    assert "test_costly (call) spent 2 CPU seconds, over the budget of 1" in text  # printed as whole seconds
    assert "test_costly_child (call) spent" in text  # the child's seconds count once it is waited for
    assert "CPU seconds: the largest test phases" in text


def test_a_budget_of_zero_turns_the_check_off(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    _run(pytester, monkeypatch, "0").assert_outcomes(passed=3)


def test_the_budget_grows_with_a_slower_machine_and_never_shrinks(monkeypatch: pytest.MonkeyPatch) -> None:
    import cpu_budget

    monkeypatch.delenv("MEMPLAN_TEST_CPU_BUDGET_S", raising=False)
    monkeypatch.setenv(cpu_budget.FACTOR_VARIABLE, "3")  # as the controlling process hands it to its workers
    assert cpu_budget.budget_s(cpu_budget.machine_factor()) == 3 * cpu_budget.DEFAULT_BUDGET_S
    monkeypatch.setenv(cpu_budget.FACTOR_VARIABLE, "0.4")  # a faster machine keeps the reference's budget
    assert cpu_budget.budget_s(cpu_budget.machine_factor()) == cpu_budget.DEFAULT_BUDGET_S
    monkeypatch.setenv("MEMPLAN_TEST_CPU_BUDGET_S", "42")  # an absolute budget is not scaled
    assert cpu_budget.budget_s(3.0) == 42.0


def test_the_factor_is_timed_where_no_process_handed_it_down(monkeypatch: pytest.MonkeyPatch) -> None:
    import cpu_budget

    monkeypatch.delenv(cpu_budget.FACTOR_VARIABLE, raising=False)
    monkeypatch.setattr(cpu_budget, "reference_cpu_s", lambda repeats=5: 5 * cpu_budget.REFERENCE_CPU_S)
    assert cpu_budget.machine_factor() == pytest.approx(5.0)


def test_the_reference_workload_spends_cpu_seconds() -> None:
    import cpu_budget

    assert cpu_budget.reference_cpu_s(repeats=1) > 0.0
