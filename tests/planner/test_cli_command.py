"""``planner.cli.main`` builds typer's click command once per process (``planner.cli.argv_check.click_command``),
not on every call, and the command it keeps carries nothing of one call into the next."""

from __future__ import annotations

from typing import Any

import pytest
from planner_helpers import assert_one_error_line, run_main

JOB = ["predict", "--model", "opt-125m", "--gpu-mem", "24G", "--cpu-mem", "64G", "--workload", "sft", "--zero", "2"]


def test_main_builds_the_click_command_once_and_keeps_no_state_of_a_call(monkeypatch: pytest.MonkeyPatch) -> None:
    import typer

    from planner.cli import app
    from planner.cli.argv_check import click_command

    built: list[Any] = []
    real = typer.main.get_command

    def counting(typer_app: Any) -> Any:
        built.append(typer_app)
        return real(typer_app)

    monkeypatch.setattr(typer.main, "get_command", counting)
    click_command.cache_clear()
    try:
        first = run_main([*JOB, "--batch", "16", "--json"])
        second = run_main([*JOB, "--batch", "4", "--micro-batch", "2", "--json"])
        refused = run_main([*JOB, "--batch", "2.0"])  # argv_check's reading of the same command
        default = run_main([*JOB, "--json"])
    finally:
        click_command.cache_clear()  # the next test's main builds with typer's own function
    assert built == [app]  # four calls, one build
    assert first.rc == second.rc == default.rc == 0, first.err + second.err + default.err
    assert first.json()["workload"]["global_batch"] == 16
    assert second.json()["workload"]["global_batch"] == 4 and second.json()["strategy"]["micro_batch"] == 2
    assert_one_error_line(refused, "--batch must be a whole number")
    # the options' defaults again, not the values of the call before
    assert default.json()["workload"]["global_batch"] != 4 and default.json()["strategy"]["micro_batch"] != 2
