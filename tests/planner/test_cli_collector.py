"""The cyclic garbage collector is paused while a short command runs (``planner.cli.collector``): its full passes
walked every object of the ~900 modules a command imports, a quarter of ``planner recommend``'s CPU seconds."""

from __future__ import annotations

import gc
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import pytest
from planner_helpers import run_main

import planner.cli
from planner.cli.collector import COLLECTED_COMMANDS, collector_paused, pauses_collector


@pytest.mark.parametrize("command", ["recommend", "predict", "check", "export", "plans", "explain", "gpus"])
def test_short_commands_run_without_the_collector(command: str) -> None:
    assert pauses_collector([command, "--help"])
    assert gc.isenabled()
    with collector_paused([command, "--model", "opt-125m"]):
        assert not gc.isenabled()
    assert gc.isenabled()  # an in-process caller keeps its collector


@pytest.mark.parametrize("command", ["probe", "tune"])
def test_commands_that_run_programs_keep_the_collector(command: str) -> None:
    assert command in COLLECTED_COMMANDS
    assert not pauses_collector([command, "--model", "opt-125m"])
    with collector_paused([command]):
        assert gc.isenabled()
    assert gc.isenabled()


def test_a_collector_the_caller_turned_off_stays_off() -> None:
    gc.disable()
    try:
        with collector_paused(["recommend"]):
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_failing_command_turns_the_collector_back_on() -> None:
    with pytest.raises(RuntimeError), collector_paused(["recommend"]):
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_main_runs_each_command_under_collector_paused(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[list[str], bool]] = []

    @contextmanager
    def recording(args: Sequence[str]) -> Iterator[None]:
        with collector_paused(args):
            seen.append((list(args), gc.isenabled()))
            yield

    monkeypatch.setattr(planner.cli, "collector_paused", recording)
    result = run_main(["explain"])
    assert result.rc == 0, result.err
    assert seen == [(["explain"], False)]
    assert gc.isenabled()
