"""The processes under a probe: found through ``/proc``, ended with their process groups.

A probe's child starts helpers (compiler workers, ninja, DeepSpeed's launchers), and some of them start
process groups or sessions of their own (ninja puts every compile command in a group of its own; PyTorch's
elastic launcher starts every rank as a session leader), so killing the child's process group is not enough.
:func:`kill_tree` stops the top process's group (nothing new starts), kills every process found under it and
every pid it was told about, each with its process group, and waits until those groups are gone;
:func:`descendants` is the walk it uses. Linux only (elsewhere no process is found under another, and only
the groups named are killed). Pure Python: no torch here.

A pid read from ``/proc`` may be reused by an unrelated process before the signal (the process exits, its parent
reaps it, a new process gets the number). :func:`kill_tree` names each process it found by (pid, start time)
from the same read of ``/proc/PID/stat``, takes a pidfd of it (``os.pidfd_open``, Linux 5.3) and reads the start
time again: the same one means the pidfd is that process, and ``signal.pidfd_send_signal`` reaches that process or
none, never a successor. Where pidfds are not had (an older kernel), the start time is read again just before
``os.kill``, which leaves a window of that read only. A process group has no such handle: its number is not
reused while a member lives, so each group is killed before its members, while the member that named it was just
seen alive; a pid only announced (a rank that reported it, no longer under the tree) is killed as a process group
only, never by its pid, whose process may be anyone's by now.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from dataclasses import dataclass

from probes.process.proc_stat import GROUP, PARENT, START, read_stat_fields

__all__ = [
    "GROUP_GONE_S",
    "Seen",
    "descendants",
    "end_descendants",
    "kill_group",
    "kill_tree",
    "seen_under",
    "signal_group",
    "wait_group_gone",
]

GROUP_GONE_S = 30.0  # the most a killed group's members may take to be reaped (their parent is init)


def kill_group(pgid: int) -> None:
    """SIGKILL every process of group ``pgid`` (gone already: nothing to do)."""
    signal_group(pgid, signal.SIGKILL)


def wait_group_gone(pgid: int) -> None:
    """Wait until nothing of a killed process group is left (its leader already reaped): helpers of the
    child (compiler workers, DeepSpeed's launchers) are reparented to init and exist, as zombies, until it
    reaps them; a probe that returns leaves none behind."""
    deadline = time.monotonic() + GROUP_GONE_S
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.02)


@dataclass(frozen=True)
class Seen:
    """One process as a read of its ``/proc/PID/stat`` showed it: (``pid``, ``start``) names it for good, a pid
    alone only until it is reused."""

    pid: int
    parent: int
    group: int
    start: int  # starttime, clock ticks after boot (proc(5) field 22)


def _stat(pid: int) -> Seen | None:
    """Process ``pid`` as ``/proc/PID/stat`` shows it now (:mod:`probes.process.proc_stat`); None when it is gone
    or cannot be read."""
    fields = read_stat_fields(pid)
    if len(fields) <= START or not all(fields[k].isdigit() for k in (PARENT, GROUP, START)):
        return None
    return Seen(pid, int(fields[PARENT]), int(fields[GROUP]), int(fields[START]))


def _all_processes() -> list[Seen]:
    found: list[Seen] = []
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if entry.isdigit() and (seen := _stat(int(entry))) is not None:
                found.append(seen)
    return found


def seen_under(pid: int) -> list[Seen]:
    """Every live process under ``pid``, each as one read of ``/proc`` showed it (elsewhere than Linux: none)."""
    children: dict[int, list[Seen]] = {}
    for seen in _all_processes():
        children.setdefault(seen.parent, []).append(seen)
    found: list[Seen] = []
    pids: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child.pid not in pids:
                pids.add(child.pid)
                found.append(child)
                todo.append(child.pid)
    return found


def descendants(pid: int) -> list[int]:
    """Every live process under ``pid`` (Linux ``/proc``; elsewhere none)."""
    return [seen.pid for seen in seen_under(pid)]


def _pin(seen: Seen) -> int | None:
    """A pidfd of the process ``seen`` names, if it is still that process (the same start time read after the
    pidfd was taken); -1 where pidfds are not had here; None when it is gone (or its pid is another's now)."""
    try:
        handle = os.pidfd_open(seen.pid)
    except (AttributeError, NotImplementedError):
        return -1
    except OSError as error:
        return -1 if error.errno == errno.ENOSYS else None
    now = _stat(seen.pid)
    if now is None or now.start != seen.start:
        os.close(handle)
        return None
    return handle


def _kill_seen(seen: Seen, handle: int) -> bool:
    """SIGKILL the process ``seen`` names through its pidfd ``handle``, or (-1: no pidfds here) by its pid once
    the start time read again says it is still that process; whether the signal was sent."""
    try:
        if handle >= 0:
            signal.pidfd_send_signal(handle, signal.SIGKILL)
        elif (now := _stat(seen.pid)) is not None and now.start == seen.start:
            os.kill(seen.pid, signal.SIGKILL)
        else:
            return False
    except (ProcessLookupError, PermissionError):
        return False
    return True


def signal_group(pgid: int, sig: int) -> None:
    """Send ``sig`` to process group ``pgid`` (gone already: nothing to do)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def kill_tree(top: int, announced: list[int]) -> None:
    """SIGKILL ``top`` (a group leader), every process under it and every announced pid's process group, and each
    found process's group; return once none of those groups is left but ``top``'s own (its leader, the caller's
    child, is a zombie until the caller reaps it: then :func:`wait_group_gone` of ``top``). A found process is
    signalled through a pidfd (the module docstring: never a process that took its pid since).

    The launcher starts every rank as a session leader (its pid is its group), so a rank that already exited
    still names the group its helpers were left in, though it is no longer under the launcher."""
    signal_group(top, signal.SIGSTOP)
    pinned: list[tuple[Seen, int]] = []
    for seen in seen_under(top):
        handle = _pin(seen)
        if handle is not None:
            pinned.append((seen, handle))
    mine = os.getpgrp()
    named = [p for p in announced if p > 1] + [seen.group for seen, _ in pinned if seen.group > 1]
    groups = [group for group in dict.fromkeys(named) if group != mine]
    try:
        for group in groups:  # first, while the members that named them were just seen alive
            signal_group(group, signal.SIGKILL)
        for seen, handle in pinned:  # those in no group of their own (this process's group) too
            _kill_seen(seen, handle)
    finally:
        for _, handle in pinned:
            if handle >= 0:
                os.close(handle)
    signal_group(top, signal.SIGKILL)
    signal_group(top, signal.SIGCONT)
    for group in groups:
        if group != top:  # the caller reaps ``top`` and then waits for its group
            wait_group_gone(group)


def end_descendants(deadline_s: float = GROUP_GONE_S) -> int:
    """SIGKILL every process under this one and reap those that become its children, until none is left (or
    ``deadline_s`` passed); returns how many were killed. Under ``PR_SET_CHILD_SUBREAPER`` (see
    :func:`probes.process.parent_watch.set_child_subreaper`) a daemon's parents exit and it becomes this
    process's child, so the walk is repeated until nothing new shows up (a killed process starts nothing). Each
    is signalled as :func:`kill_tree` signals a found process (through a pidfd)."""
    me = os.getpid()
    killed: set[int] = set()
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        found = seen_under(me)
        for seen in found:
            handle = _pin(seen)
            if handle is None:
                continue
            if _kill_seen(seen, handle):
                killed.add(seen.pid)
            if handle >= 0:
                os.close(handle)
        _reap_children()
        if not found:
            break
        time.sleep(0.01)
    return len(killed)


def _reap_children() -> None:
    """Reap every child of this process that has ended (a subreaper's adopted orphans included)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
