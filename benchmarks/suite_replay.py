"""A suite report's phases replayed through pytest-xdist's loadscope hand-out: when would each worker have ended?

pytest-xdist 3.8's ``LoadScopeScheduling`` (``xdist/scheduler/loadscope.py``) splits the collection into work units
(a module, or a class in it), queues them (by default sorted by their number of tests, most first:
``--loadscope-reorder``) and gives each worker one unit, then one more while the worker has two tests or fewer
pending, and so on each time a test of it ends. Replayed here with each test's CPU seconds in the report as its
duration (one worker a core): the ends of the workers in xdist's own order and in the order of a weight table
(tests/schedule.py), to judge a schedule without running the suite. Durations are CPU seconds, not wall seconds:
a test that waits (a child's start, a socket) takes longer than it spends.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Protocol

LOW_WATERMARK = 2  # xdist hands a worker its next unit when it has this many tests pending or fewer


class TimedPhase(Protocol):
    """What the replay reads of a report line (benchmarks.suite_cpu.Phase)."""

    @property
    def cpu_s(self) -> float: ...

    @property
    def nodeid(self) -> str: ...


def test_seconds(phases: Sequence[TimedPhase]) -> dict[str, float]:
    """Each test's seconds over its phases (setup, call, teardown), in the order the report first names it."""
    seconds: dict[str, float] = {}
    for phase in phases:
        seconds[phase.nodeid] = seconds.get(phase.nodeid, 0.0) + phase.cpu_s
    return seconds


def collection_order(nodeids: Sequence[str]) -> list[str]:
    """The tests as pytest collects them, near enough: the modules by path, each module's tests in their order."""
    modules: dict[str, list[str]] = {}
    for nodeid in nodeids:
        modules.setdefault(nodeid.split("::", 1)[0], []).append(nodeid)
    return [nodeid for module in sorted(modules, key=lambda m: PurePosixPath(m).parts) for nodeid in modules[module]]


def work_units(nodeids: Sequence[str], by_test_count: bool) -> list[list[str]]:
    """xdist's queue of units (a nodeid's scope: all before its last ``::``), sorted by test count if asked."""
    units: dict[str, list[str]] = {}
    for nodeid in nodeids:
        units.setdefault(nodeid.rsplit("::", 1)[0], []).append(nodeid)
    queue = list(units.values())
    return sorted(queue, key=lambda unit: -len(unit)) if by_test_count else queue


def replay(queue: Sequence[Sequence[str]], seconds: Mapping[str, float], workers: int = 2) -> list[float]:
    """Each worker's end, in seconds from the start, handing the units out as xdist does."""
    waiting = [list(unit) for unit in queue]
    pending: list[list[str]] = [[] for _ in range(workers)]
    clock = [0.0] * workers

    def hand_out(worker: int) -> None:
        if waiting:
            pending[worker].extend(waiting.pop(0))

    for worker in range(workers):
        hand_out(worker)
    for worker in range(workers):
        if len(pending[worker]) <= LOW_WATERMARK:
            hand_out(worker)
    while any(pending):
        worker = min((w for w in range(workers) if pending[w]), key=lambda w: clock[w] + seconds[pending[w][0]])
        clock[worker] += seconds[pending[worker].pop(0)]
        if len(pending[worker]) <= LOW_WATERMARK:
            hand_out(worker)
    return clock


def replay_lines(phases: Sequence[TimedPhase], weights: Mapping[str, float], workers: int = 2) -> list[str]:
    """Markdown lines: the workers' ends in xdist's own order and in the weights' (tests/schedule.py)."""
    seconds = test_seconds(phases)
    collected = collection_order(list(seconds))
    groups: dict[str, list[str]] = {}
    for nodeid in collected:
        groups.setdefault(nodeid.split("::", 1)[0], []).append(nodeid)
    # tests/schedule.py's order_by_weight: the weighed modules heaviest first, then the others as collected
    weighed = sorted((m for m in groups if m in weights), key=lambda m: -weights[m])
    ordered = [n for m in (*weighed, *(m for m in groups if m not in weights)) for n in groups[m]]
    lines = ["| replayed order | workers end at s | tail s |", "|---|---|---:|"]
    for name, queue in (
        ("xdist's (by test count)", work_units(collected, by_test_count=True)),
        ("the weights' (heaviest module first)", work_units(ordered, by_test_count=False)),
    ):
        ends = replay(queue, seconds, workers)
        lines.append(f"| {name} | {', '.join(f'{end:.0f}' for end in ends)} | {max(ends) - min(ends):.0f} |")
    return [*lines, ""]
