"""The suite's schedule: the heaviest test modules first, so that no worker is left alone with one at the end.

``make test`` runs ``pytest -n 2 --dist loadscope``. pytest-xdist's loadscope scheduler (xdist 3.8,
``xdist/scheduler/loadscope.py``, ``LoadScopeScheduling.schedule``) groups the collected items into work units by
scope (a module, or a class in it), queues the units and hands them out one at a time, from the front, to whichever
worker is down to two pending tests. Its queue is the collection order, except that by default
(``--loadscope-reorder``) it first sorts the units by their number of tests, most first. That put the heavy modules
of few, slow tests (the accuracy probes, the user's type check, the fault suite) near the end of the queue: in run 13
of benchmarks/results/suite_cpu.md the user's type check (59 CPU s) began after 96% of the phases had run.

Here the workers order the collected items by a weight table (``tests/module_weights.json``, each module's CPU
seconds in a suite report, written by ``benchmarks/suite_cpu.py --write-weights``): the weighed modules heaviest
first (longest processing time first), then the modules the table does not know, in collection order. Each
module's tests stay together and in their own order. The controlling process turns xdist's reordering off
(unless ``--loadscope-reorder`` is given), so the queue is this order. The order only schedules: no test depends
on it, and the suite passes in any order.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import pytest

WEIGHTS_FILE = Path(__file__).with_name("module_weights.json")
_DISTRIBUTIONS_BY_SCOPE = ("loadscope", "loadfile")  # the modes whose scheduler xdist reorders by test count

T = TypeVar("T")


def module_of(nodeid: str) -> str:
    """The test module a node id belongs to: ``tests/a/test_b.py::test_c[x]`` -> ``tests/a/test_b.py``."""
    return nodeid.split("::", 1)[0]


def order_by_weight(items: Sequence[T], weights: Mapping[str, float], module: Callable[[T], str]) -> list[T]:
    """``items`` grouped by ``module(item)``: the modules in ``weights`` heaviest first (ties in collection order),
    then the others in collection order; each module's items in their own order."""
    groups: dict[str, list[T]] = {}
    for item in items:
        groups.setdefault(module(item), []).append(item)
    weighed = sorted((name for name in groups if name in weights), key=lambda name: -weights[name])
    unweighed = [name for name in groups if name not in weights]
    return [item for name in (*weighed, *unweighed) for item in groups[name]]


def load_weights(path: Path = WEIGHTS_FILE) -> dict[str, float]:
    """The weight table's ``modules`` (module path -> CPU seconds); empty where there is no table."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    return {str(name): float(seconds) for name, seconds in document["modules"].items()}


def pytest_configure(config: pytest.Config) -> None:
    """In the controlling process: xdist's loadscope queue follows the collection order (set below) rather than
    its own sort by test count, unless the command line asks for that sort."""
    if getattr(config.option, "dist", "no") in _DISTRIBUTIONS_BY_SCOPE and not any(
        argument == "--loadscope-reorder" for argument in config.invocation_params.args
    ):
        config.option.loadscopereorder = False


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The collected items, heaviest module first (:func:`order_by_weight` over ``tests/module_weights.json``),
    unless the command line asked for pytest's own order of last failures (``--ff``) or new files (``--nf``)."""
    if config.getoption("failedfirst", False) or config.getoption("newfirst", False):
        return
    weights = load_weights()
    if weights:
        items[:] = order_by_weight(items, weights, lambda item: module_of(item.nodeid))
