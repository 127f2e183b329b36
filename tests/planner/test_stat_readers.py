"""``probes.process.proc_stat``: the one parser of ``/proc/PID/stat``, which the process tree, the tune's claims and
the fault suite's oracle all read a process by. A command name may hold spaces and parentheses (``a) b (c``): the
fields are read after the line's last ``)``. No new process: this one's own name is changed for the while."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fault_processes import start_time, stat_fields

from planner.tuning.claims import owner
from probes.process import process_tree
from probes.process.proc_stat import GROUP, PARENT, START, STATE, fields_after_command, started_at_utc

TRICKY = "a) b (c) 1 2"  # what a naive split (first ")", or every space) misreads as state, parent and group


def test_the_fields_are_read_after_the_last_parenthesis() -> None:
    tail = [b"S", b"17", b"4242"] + [b"0"] * 16 + [b"987654"] + [b"0"] * 30
    line = b"4242 (" + TRICKY.encode() + b") " + b" ".join(tail) + b"\n"
    fields = fields_after_command(line)
    assert fields == tail
    assert (fields[STATE], fields[PARENT], fields[GROUP], fields[START]) == (b"S", b"17", b"4242", b"987654")
    assert fields_after_command(b"") == []  # a process gone: its file reads empty
    assert fields_after_command(b"not a stat line") == []


@pytest.fixture
def tricky_name() -> Iterator[str]:
    """This process called ``a) b (c) 1 2`` (cut to the kernel's 15 bytes) while the test runs."""
    comm = Path("/proc/self/comm")
    if not comm.exists():
        pytest.skip("no /proc here")
    before = comm.read_text().rstrip("\n")
    comm.write_text(TRICKY)
    try:
        yield comm.read_text().rstrip("\n")
    finally:
        comm.write_text(before)


def test_every_reader_of_a_process_reads_it_whatever_its_name(tricky_name: str) -> None:
    assert ")" in tricky_name and " " in tricky_name  # the kernel kept what makes the name tricky
    me = process_tree._stat(os.getpid())
    assert me is not None and (me.parent, me.group) == (os.getppid(), os.getpgrp())
    fields = stat_fields(os.getpid())
    assert int(fields[PARENT]) == os.getppid() and int(fields[START]) == me.start == start_time(os.getpid())
    assert owner()["owner_started"] == str(me.start)


def test_a_start_time_is_a_wall_clock_time_after_boot() -> None:
    boot = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    ticks = os.sysconf("SC_CLK_TCK")
    assert started_at_utc(90 * ticks + ticks // 2, boot) == boot + timedelta(seconds=90.5)
