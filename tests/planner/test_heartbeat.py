"""A long first use of a local config says it is still working (issue 44 item 5): ``planner.job.heartbeat``."""

from __future__ import annotations

import io

from planner.job.heartbeat import Heartbeat, heartbeat, heartbeat_interval


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_line_each_interval_with_the_elapsed_time() -> None:
    clock, out = Clock(), io.StringIO()
    beat = Heartbeat("tracing the activations of olmo2", out, 30.0, clock)
    clock.now += 29.0
    assert not beat.due() and out.getvalue() == ""
    clock.now += 1.0
    assert beat.due()
    clock.now += 60.0
    assert beat.due()
    assert out.getvalue().splitlines() == [
        "memplan: still tracing the activations of olmo2: 30s",
        "memplan: still tracing the activations of olmo2: 1m30s",
    ]


def test_the_interval_comes_from_the_probe_progress_variable() -> None:
    assert heartbeat_interval({}) == 30.0
    assert heartbeat_interval({"MEMPLAN_PROGRESS_INTERVAL_S": "5"}) == 5.0
    assert heartbeat_interval({"MEMPLAN_PROGRESS_INTERVAL_S": "0"}) is None
    assert heartbeat_interval({"MEMPLAN_PROGRESS_INTERVAL_S": "soon"}) == 30.0


def test_the_context_writes_nothing_for_a_short_step_and_nothing_when_turned_off() -> None:
    out = io.StringIO()
    with heartbeat("reading x", out, env={"MEMPLAN_PROGRESS_INTERVAL_S": "3600"}):
        pass
    with heartbeat("reading x", out, env={"MEMPLAN_PROGRESS_INTERVAL_S": "0"}):
        pass
    assert out.getvalue() == ""


def test_the_local_config_steps_run_under_a_heartbeat() -> None:
    """Both first-use steps of a local config (reading its shape, tracing its activations) are wrapped."""
    import inspect

    import planner.job.model_shapes as shapes

    for step in (shapes._trace, shapes._with_terms):
        assert "with heartbeat(" in inspect.getsource(step), step.__name__
