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
from probes.process.parent_watch import PLANNER_PID_VARIABLE
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


def _session(script: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], list[int]]:
    """``sh -c script`` in a session of its own; the pids it prints, one a line, once it said ``started``."""
    top = subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE, start_new_session=True, env=env)
    assert top.stdout is not None
    said: list[int] = []
    while (line := top.stdout.readline()) not in (b"started\n", b""):
        said.append(int(line))
    return top, said


def _alive(pidfd: int) -> bool:
    return not select.select([pidfd], [], [], 0)[0]


def test_an_announced_groups_number_led_by_another_process_now_is_not_signalled() -> None:
    """A rank announced its pid and exited; the number is a free pid again, and another process (a shell job, a
    daemon: no planner's mark in its environment) got it and leads a group of that number. The old kill_tree
    killed that group by its number; now no group is signalled by its number, and an unmarked process of a group
    no process of the tree witnesses is never taken for the rank's."""
    unmarked = {k: v for k, v in os.environ.items() if k != PLANNER_PID_VARIABLE}
    stranger = subprocess.Popen(["sleep", "600"], start_new_session=True, env=unmarked)
    top, _ = _session("echo started; exec sleep 600")
    watched = os.pidfd_open(stranger.pid)
    try:
        kill_tree(top.pid, [stranger.pid])
        assert _alive(watched)
    finally:
        os.close(watched)
        for proc in (top, stranger):
            proc.kill()
            proc.wait()


def test_what_the_tree_left_in_its_groups_is_killed_through_pidfds() -> None:
    """Two members of the tree's groups that are no longer under it, each killed through its pidfd:

    - a rank (its group's leader) has exited and been reaped; its helper, reparented away, is left in the group
      and carries the planner's mark (``MEMPLAN_PLANNER_PID``, inherited): no process of the tree is in that
      group, the mark says it is the planner's;
    - a process of the tree leads a session (its group); a member of that group left the tree (its parent exited)
      and carries no mark: the tree's process witnesses the group while /proc is read."""
    marked = {**os.environ, PLANNER_PID_VARIABLE: str(os.getpid())}
    rank, (helper,) = _session("sleep 600 & echo $!; echo started", env=marked)
    assert rank.wait() == 0  # the leader is gone; its helper still holds the group's number
    top, (member,) = _session("setsid sh -c '(sleep 600 & echo $!); echo started; exec sleep 600' & wait")
    watched = [os.pidfd_open(helper), os.pidfd_open(member)]
    try:
        (leader,) = seen_under(top.pid)
        outside = process_tree._stat(member)
        assert outside is not None and outside.group == leader.group and outside.parent != leader.pid
        kill_tree(top.pid, [rank.pid])
        assert all(_ended(pidfd) for pidfd in watched)
    finally:
        for pidfd in watched:
            os.close(pidfd)
        top.kill()
        top.wait()


def test_a_top_that_is_not_the_callers_child_is_signalled_only_if_it_carries_the_mark() -> None:
    """``top`` named by a pid the caller did not start itself (a child the preloaded starter forked, which the
    starter reaps) may be anyone's by now: an unmarked process at that number, leading its own group, is left
    alone. The old kill_tree stopped and killed ``top``'s group by its number."""
    unmarked = {k: v for k, v in os.environ.items() if k != PLANNER_PID_VARIABLE}
    starter, (orphan,) = _session("setsid sh -c 'echo $$; echo started; exec sleep 600' &", env=unmarked)
    assert starter.wait() == 0  # the orphan is not this process's child
    watched = os.pidfd_open(orphan)
    try:
        assert process_tree._stat(orphan) is not None and process_tree._stat(orphan).group == orphan  # type: ignore[union-attr]
        kill_tree(orphan, [])
        assert _alive(watched)
    finally:
        signal.pidfd_send_signal(watched, signal.SIGKILL)
        os.close(watched)
