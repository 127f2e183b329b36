"""The processes under a probe: found through ``/proc``, ended with their process groups.

A probe's child starts helpers (compiler workers, ninja, DeepSpeed's launchers), and some of them start
process groups or sessions of their own (ninja puts every compile command in a group of its own; PyTorch's
elastic launcher starts every rank as a session leader), so killing the child's process group is not enough.
:func:`kill_tree` stops the top process's group (nothing new starts), kills every process found under it and
every pid it was told about, each with its process group, and waits until those groups are gone;
:func:`descendants` is the walk it uses. Linux only (elsewhere no process is found under another, and only
the groups named are killed). Pure Python: no torch here.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

__all__ = [
    "GROUP_GONE_S",
    "descendants",
    "end_descendants",
    "kill_group",
    "kill_tree",
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


def _children_by_parent() -> dict[int, list[int]]:
    found: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[-1].split()
            if len(fields) > 1 and fields[1].isdigit():
                found.setdefault(int(fields[1]), []).append(int(entry))
    return found


def descendants(pid: int) -> list[int]:
    """Every live process under ``pid`` (Linux ``/proc``; elsewhere none)."""
    children, seen, todo = _children_by_parent(), [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in seen:
                seen.append(child)
                todo.append(child)
    return seen


def signal_group(pgid: int, sig: int) -> None:
    """Send ``sig`` to process group ``pgid`` (gone already: nothing to do)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def kill_tree(top: int, announced: list[int]) -> None:
    """SIGKILL ``top`` (a group leader), every process under it and every announced pid, each with its process
    group; return once none of those groups is left but ``top``'s own (its leader, the caller's child, is a zombie
    until the caller reaps it: then :func:`wait_group_gone` of ``top``).

    The launcher starts every rank as a session leader (its pid is its group), so a rank that already exited
    still names the group its helpers were left in, though it is no longer under the launcher."""
    signal_group(top, signal.SIGSTOP)
    pids = descendants(top) + [p for p in announced if p > 1]
    groups: list[int] = [p for p in announced if p > 1]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            group = os.getpgid(pid)
            if group not in groups and group > 1 and group != os.getpgrp():
                groups.append(group)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    for group in groups:
        signal_group(group, signal.SIGKILL)
    signal_group(top, signal.SIGKILL)
    signal_group(top, signal.SIGCONT)
    for group in groups:
        if group != top:  # the caller reaps ``top`` and then waits for its group
            wait_group_gone(group)


def end_descendants(deadline_s: float = GROUP_GONE_S) -> int:
    """SIGKILL every process under this one and reap those that become its children, until none is left (or
    ``deadline_s`` passed); returns how many were killed. Under ``PR_SET_CHILD_SUBREAPER`` (see
    :func:`probes.process.parent_watch.set_child_subreaper`) a daemon's parents exit and it becomes this
    process's child, so the walk is repeated until nothing new shows up (a killed process starts nothing)."""
    me = os.getpid()
    killed: set[int] = set()
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        found = descendants(me)
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
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
