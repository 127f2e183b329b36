"""A long first use of a local config says it is still working (issue 44 item 5): ``planner.job.heartbeat``,
through the caller's ``on_note``, at the interval and in the elapsed-time format of the probes' progress lines
(``planner.progress``, one reading for both: issue 45)."""

from __future__ import annotations

import ast
import io
from contextlib import redirect_stderr

from planner_helpers import REPO

from planner.job.heartbeat import Heartbeat, heartbeat
from planner.progress import interval_s


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_line_each_interval_with_the_elapsed_time() -> None:
    clock, said = Clock(), []
    beat = Heartbeat("tracing the activations of olmo2", said.append, 30.0, clock)
    clock.now += 29.0
    assert not beat.due() and said == []
    clock.now += 1.0
    assert beat.due()
    clock.now += 60.0
    assert beat.due()
    clock.now += 30.0
    assert beat.due()
    assert said == [
        "memplan: still tracing the activations of olmo2: 30s",
        "memplan: still tracing the activations of olmo2: 1m30s",
        "memplan: still tracing the activations of olmo2: 2m",  # as a probe's heartbeat says it
    ]


def test_the_interval_comes_from_the_probe_progress_variable() -> None:
    assert interval_s({}) == 30.0
    assert interval_s({"MEMPLAN_PROGRESS_INTERVAL_S": "5"}) == 5.0
    assert interval_s({"MEMPLAN_PROGRESS_INTERVAL_S": "0"}) is None
    assert interval_s({"MEMPLAN_PROGRESS_INTERVAL_S": "soon"}) == 30.0


def test_the_interval_and_the_elapsed_time_are_read_in_one_place() -> None:
    """The job layer's heartbeat and the CLI's probe lines read the variable and write the time through
    ``planner.progress``: neither names the variable nor formats minutes itself."""
    for path in (REPO / "planner" / "job" / "heartbeat.py", REPO / "planner" / "cli" / "progress.py"):
        source = path.read_text()
        strings = [n.value for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Constant)]
        assert "MEMPLAN_PROGRESS_INTERVAL_S" not in strings, path
        assert "divmod(" not in source, path


def test_the_context_writes_nothing_for_a_short_step_and_nothing_when_turned_off() -> None:
    said: list[str] = []
    err = io.StringIO()
    with redirect_stderr(err):
        with heartbeat("reading x", said.append, env={"MEMPLAN_PROGRESS_INTERVAL_S": "3600"}):
            pass
        with heartbeat("reading x", said.append, env={"MEMPLAN_PROGRESS_INTERVAL_S": "0"}):
            pass
    assert said == [] and err.getvalue() == ""


def test_the_local_config_steps_run_under_a_heartbeat() -> None:
    """Both first-use steps of a local config (reading its shape, tracing its activations) are wrapped."""
    import inspect

    import planner.job.model_shapes as shapes

    for step in (shapes._trace, shapes._with_terms):
        assert "with heartbeat(" in inspect.getsource(step), step.__name__
    # and say what they do through the caller's on_note, never straight to stderr (issue 45)
    source = inspect.getsource(shapes)
    assert "print(" not in source and "sys.stderr" not in source
