"""The suite's schedule (tests/schedule.py) and the report it is weighed from (benchmarks/suite_cpu.py): pure
functions over made-up node ids and report lines."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from schedule import WEIGHTS_FILE, load_weights, module_of, order_by_weight
from schedule import pytest_collection_modifyitems as schedule_items
from schedule import pytest_configure as schedule_configure

from benchmarks.suite_cpu import read_report, weights_document, worker_lines

COLLECTED = [
    "tests/a/test_light.py::test_one",
    "tests/a/test_light.py::test_two",
    "tests/b/test_heavy.py::test_slow[x]",
    "tests/b/test_heavy.py::Group::test_slow[y]",
    "tests/c/test_new.py::test_unweighed",
    "tests/d/test_middle.py::test_three",
    "tests/d/test_middle.py::test_four",
    "tests/e/test_also_new.py::test_unweighed",
    "tests/f/test_tie.py::test_five",
]
WEIGHTS = {"tests/a/test_light.py": 1.0, "tests/b/test_heavy.py": 90.0, "tests/d/test_middle.py": 10.0,
           "tests/f/test_tie.py": 10.0, "tests/z/test_gone.py": 500.0}  # fmt: skip


def test_the_heaviest_module_goes_first_each_kept_whole_and_in_its_own_order() -> None:
    ordered = order_by_weight(COLLECTED, WEIGHTS, module_of)
    assert ordered == [
        "tests/b/test_heavy.py::test_slow[x]",
        "tests/b/test_heavy.py::Group::test_slow[y]",
        "tests/d/test_middle.py::test_three",  # a tie keeps the collection order: middle before tie
        "tests/d/test_middle.py::test_four",
        "tests/f/test_tie.py::test_five",
        "tests/a/test_light.py::test_one",
        "tests/a/test_light.py::test_two",
        "tests/c/test_new.py::test_unweighed",  # the modules the table does not know: after, in collection order
        "tests/e/test_also_new.py::test_unweighed",
    ]


def test_without_weights_the_collection_order_stands() -> None:
    assert order_by_weight(COLLECTED, {}, module_of) == COLLECTED


def _config(dist: str, *args: str) -> Any:
    return SimpleNamespace(
        option=SimpleNamespace(dist=dist, loadscopereorder=True), invocation_params=SimpleNamespace(args=args)
    )


def test_xdists_reordering_by_test_count_is_turned_off_unless_asked_for() -> None:
    """pytest-xdist's loadscope sorts its queue by tests per module by default, which would undo the order."""
    config = _config("loadscope", "-n", "2", "--dist", "loadscope")
    schedule_configure(config)
    assert config.option.loadscopereorder is False
    asked = _config("loadscope", "--loadscope-reorder")
    schedule_configure(asked)
    assert asked.option.loadscopereorder is True


def test_the_checked_in_weights_are_read(tmp_path: Path) -> None:
    weights = load_weights(WEIGHTS_FILE)
    assert weights and all(name.startswith("tests/") and name.endswith(".py") for name in weights)
    assert all(seconds >= 0.0 for seconds in weights.values())
    assert load_weights(tmp_path / "none.json") == {}


def test_the_hook_orders_by_the_checked_in_table_unless_failures_go_first() -> None:
    weights = load_weights()
    light, heavy = min(weights, key=weights.__getitem__), max(weights, key=weights.__getitem__)
    collected = [SimpleNamespace(nodeid=f"{light}::test_a"), SimpleNamespace(nodeid=f"{heavy}::test_b")]
    options = {"failedfirst": False, "newfirst": False}
    config: Any = SimpleNamespace(getoption=lambda name, default=None: options.get(name, default))
    items: list[Any] = list(collected)
    schedule_items(config, items)
    assert [item.nodeid for item in items] == [f"{heavy}::test_b", f"{light}::test_a"]
    options["failedfirst"] = True  # --ff: pytest's cache plugin put the last failures first; that order stands
    items = list(collected)
    schedule_items(config, items)
    assert items == collected


REPORT = """\
10.00\ttests/b/test_heavy.py::test_slow[x]\tcall\tgw0\t1000.000\t1010.000
0.50\ttests/a/test_light.py::test_one\tsetup\tgw1\t1000.000\t1001.000
2.00\ttests/a/test_light.py::test_one\tcall\tgw1\t1001.000\t1003.000
4.00\ttests/b/test_heavy.py::Group::test_slow[y]\tcall\tgw0\t1010.000\t1030.000
"""


def test_the_report_gives_each_workers_busy_time_and_the_tail() -> None:
    phases = read_report(REPORT)
    assert [(p.worker, p.start, p.end) for p in phases][:2] == [("gw0", 1000.0, 1010.0), ("gw1", 1000.0, 1001.0)]
    table = "\n".join(worker_lines(phases, run_start=990.0))
    assert "| gw0 | 2 | 14 | 30 | 10 | 40 |" in table  # busy 10 + 20 s; from 10 s after the start to 40
    assert "| gw1 | 2 | 2 | 3 | 10 | 13 |" in table
    assert "waited 27 s for the last" in table


def test_an_older_report_without_workers_still_reads_and_weighs() -> None:
    phases = read_report("1.50\ttests/a/test_light.py::test_one\tcall\n2.20\ttests/a/test_light.py::test_two\tcall\n")
    assert worker_lines(phases) == []
    assert weights_document(phases, "made up")["modules"] == {"tests/a/test_light.py": 3.7}


@pytest.mark.parametrize("nodeid", ["tests/x/test_y.py::test_z[a::b]", "tests/x/test_y.py::K::test_z"])
def test_a_node_ids_module_is_its_path(nodeid: str) -> None:
    assert module_of(nodeid) == "tests/x/test_y.py"


def test_the_replay_hands_out_units_as_xdist_does() -> None:
    """Three light modules of four 1-s tests and a heavy one of one 12-s test, worked out by hand. xdist's order
    (by test count) queues the heavy one last: the first worker to be down to two pending tests (gw1 at 2 s, after
    gw0 took light2) takes it, and ends at 16 while gw0 ends at 8. Weighted, the heavy module goes first, but a
    worker holding one test is under xdist's watermark of two and takes the next unit at once: gw0 runs the heavy
    test and then light1 (16), gw1 light0 and light2 (8). The watermark, not the queue, decides such a case."""
    from benchmarks.suite_replay import replay, replay_lines, work_units

    lines = [f"1.00\ttests/test_light{m}.py::test_{i}\tcall" for m in range(3) for i in range(4)]
    lines.append("12.00\ttests/test_heavy.py::test_slow\tcall")
    phases = read_report("\n".join(lines))
    seconds = {p.nodeid: p.cpu_s for p in phases}
    assert replay(work_units([p.nodeid for p in phases], by_test_count=True), seconds) == [8.0, 16.0]
    table = "\n".join(replay_lines(phases, {"tests/test_heavy.py": 12.0, "tests/test_light0.py": 4.0}))
    assert "| xdist's (by test count) | 8, 16 | 8 |" in table
    assert "| the weights' (heaviest module first) | 16, 8 | 8 |" in table
