"""``probes.process.process_tree``: a process found under the tree is signalled as the process it was found as,
never one that took its pid since, and a pid only announced is killed as a process group, never by its number.

Real processes, few and idle (``sleep``): a pid's reuse cannot be staged on demand, so a reuse is shown as what
it looks like to the code, a (pid, start time) that no longer matches the live process at that pid. No waiting
on a clock: a process's end is read from its pidfd (readable once it has exited) or from ``wait``.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import replace

import pytest

from probes.process import process_tree
from probes.process.process_tree import Seen, kill_tree, seen_under

ENDED_WITHIN_S = 60.0  # a cap on a wait that a SIGKILLed process ends at once; never reached when all is well


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """An idle child in this process's own group: ended after the test whatever happened."""
    child = subprocess.Popen(["sleep", "600"])
    yield child
    child.kill()
    child.wait()


def _ended(pidfd: int) -> bool:
    return bool(select.select([pidfd], [], [], ENDED_WITHIN_S)[0])


def _found(pid: int) -> Seen:
    (found,) = [seen for seen in seen_under(os.getpid()) if seen.pid == pid]
    return found


def test_a_process_is_read_from_proc_with_its_parent_group_and_start_time(sleeper: subprocess.Popen[bytes]) -> None:
    found = _found(sleeper.pid)
    assert (found.parent, found.group) == (os.getpid(), os.getpgrp())
    me = process_tree._stat(os.getpid())
    assert me is not None and found.start >= me.start  # a child starts no earlier than its parent
    assert process_tree._stat(sleeper.pid) == found


def test_a_pid_whose_start_time_changed_is_another_process_and_is_not_signalled(
    sleeper: subprocess.Popen[bytes],
) -> None:
    found = _found(sleeper.pid)
    reused = replace(found, start=found.start + 1)  # what a successor at the same pid looks like
    assert process_tree._pin(reused) is None
    assert process_tree._kill_seen(reused, -1) is False  # the fallback without pidfds reads the start time too
    assert sleeper.poll() is None
    handle = process_tree._pin(found)
    assert handle is not None and handle >= 0
    try:
        assert process_tree._kill_seen(found, handle) is True
    finally:
        os.close(handle)
    assert sleeper.wait() == -signal.SIGKILL


def test_an_announced_pid_is_killed_as_a_group_never_by_its_number(sleeper: subprocess.Popen[bytes]) -> None:
    """The sleeper stands for an announced rank's pid now held by an unrelated process (not a group leader, not
    under the tree); the tree's own process in a session of its own is killed."""
    helper_code = "setsid sh -c 'echo started; exec sleep 600' & wait"  # says so once in a session of its own
    top = subprocess.Popen(["sh", "-c", helper_code], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert top.stdout is not None and top.stdout.readline() == b"started\n"
        (helper,) = seen_under(top.pid)
        assert helper.group == helper.pid != top.pid
        watched = os.pidfd_open(helper.pid)
        kill_tree(top.pid, [sleeper.pid])
        assert _ended(watched)
        os.close(watched)
    finally:
        top.kill()
        top.wait()
    assert sleeper.poll() is None  # the old kill_tree sent it SIGKILL by its pid
