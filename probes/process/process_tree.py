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
``os.kill``, which leaves a window of that read only.

A process group number has no such handle, and it is reused: once its last member is gone, the number is a free
pid again (Linux frees a pid number when no task holds it as its pid, group or session; a pidfd does not hold
it), and a new process given it that calls ``setsid`` or ``setpgid(0, 0)`` (a shell job, a daemon) leads a group
of the same number. A pid only announced (a rank that reported it and exited, its helpers left in its group) may
be minutes old by the kill; a group named by a member just found may lose its last member between the read and
the kill. So no group is signalled by its number (but ``top``'s, the caller's unreaped child's, whose number is
held by it): each member is signalled through its own pidfd, and a process is taken as a member of a group only
where that is known to be the group the tree made, not a successor of its number (:func:`_hold_groups`):

- while a witness of the group lives: a process of the tree, or one already held, seen in the group before the
  read of ``/proc`` and alive, with the same start time, after it (held processes are stopped, so they stay alive
  until killed); while one member lives the number is not reused, so every process the read saw in the group was
  in the tree's group;
- or, with no witness (an announced rank's group whose leader has exited), where the process's environment
  carries this planner's mark (``MEMPLAN_PLANNER_PID``, set in every probe child's environment by
  :func:`probes.process.isolation.child_env` and inherited by what it starts): a successor of the number is
  someone else's and carries no such mark, so it is never signalled. A helper that cleared its environment in a
  group whose every other member is gone is not found that way; it still ends with the planner
  (:mod:`probes.process.parent_watch`).

Each member found is stopped at once (SIGSTOP through its pidfd: it starts nothing more and stays alive as a
witness), the read is repeated until it finds no new member, and then every held process is killed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from probes.process.proc_stat import GROUP, PARENT, START, STATE, read_stat_fields

__all__ = [
    "GROUP_GONE_S",
    "Seen",
    "descendants",
    "end_descendants",
    "kill_group",
    "PLANNER_PID_VARIABLE",
    "kill_tree",
    "kill_under",
    "seen_under",
    "signal_group",
    "wait_group_gone",
]

PLANNER_PID_VARIABLE = "MEMPLAN_PLANNER_PID"  # set in every child a planner starts (probes.process.isolation)
GROUP_GONE_S = 30.0  # the most a killed group's members may take to be reaped (their parent is init)


def kill_group(pgid: int) -> None:
    """SIGKILL every process of group ``pgid`` (gone already: nothing to do), by its number: safe while a member
    the caller knows holds the number (its own unreaped child, the leader). After the leader is reaped
    (:func:`probes.process.isolation.run_child` ends its child's helpers so) a member left holds it too; with
    none left, the number is free and the signal reaches a successor only if, between the reap and this call in
    the same thread, the pid counter came round to it and its new process made itself a group leader."""
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
    ended: bool = False  # a zombie (state Z or X): it holds its numbers until reaped, but does nothing


def _stat(pid: int) -> Seen | None:
    """Process ``pid`` as ``/proc/PID/stat`` shows it now (:mod:`probes.process.proc_stat`); None when it is gone
    or cannot be read."""
    fields = read_stat_fields(pid)
    if len(fields) <= START or not all(fields[k].isdigit() for k in (PARENT, GROUP, START)):
        return None
    return Seen(pid, int(fields[PARENT]), int(fields[GROUP]), int(fields[START]), fields[STATE] in (b"Z", b"X"))


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


def _signal_seen(seen: Seen, handle: int, sig: int) -> bool:
    """Send ``sig`` to the process ``seen`` names through its pidfd ``handle``, or (-1: no pidfds here) by its pid
    once the start time read again says it is still that process; whether the signal was sent."""
    try:
        if handle >= 0:
            signal.pidfd_send_signal(handle, sig)
        elif (now := _stat(seen.pid)) is not None and now.start == seen.start:
            os.kill(seen.pid, sig)
        else:
            return False
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _kill_seen(seen: Seen, handle: int) -> bool:
    """SIGKILL the process ``seen`` names (:func:`_signal_seen`); whether the signal was sent."""
    return _signal_seen(seen, handle, signal.SIGKILL)


def signal_group(pgid: int, sig: int) -> None:
    """Send ``sig`` to process group ``pgid`` (gone already: nothing to do)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


HOLD_ROUNDS = 64  # reads of /proc at most while members are still found (each stops what it finds)


def _marks() -> set[bytes]:
    """The environment entries that make a process this planner's: ``MEMPLAN_PLANNER_PID`` set to this process
    (the planner) or to the planner this process was started by."""
    values = {str(os.getpid()), os.environ.get(PLANNER_PID_VARIABLE, "")}
    return {f"{PLANNER_PID_VARIABLE}={value}".encode() for value in values if value}


def _carries(pid: int, marks: set[bytes]) -> bool:
    """Whether process ``pid`` was started with one of ``marks`` in its environment (False where unreadable)."""
    try:
        environment = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return not marks.isdisjoint(environment.split(b"\0"))


def _hold(seen: Seen, held: dict[int, tuple[Seen, int]]) -> None:
    """Pin the process ``seen`` names (:func:`_pin`) and stop it through the pin; kept in ``held`` by pid."""
    if seen.pid in held or seen.ended:
        return
    handle = _pin(seen)
    if handle is not None:
        held[seen.pid] = (seen, handle)
        _signal_seen(seen, handle, signal.SIGSTOP)


def _witnessed(held: dict[int, tuple[Seen, int]]) -> set[int]:
    """The groups a held process is in now, alive and still itself (its start time): while it is, the number
    is that group's, not a successor's."""
    groups = set()
    for seen, _ in held.values():
        now = _stat(seen.pid)
        if now is not None and now.start == seen.start and not now.ended:
            groups.add(now.group)
    return groups


def _hold_groups(groups: set[int], held: dict[int, tuple[Seen, int]], marks: set[bytes], mine: int) -> None:
    """Hold (pin and stop) every process of ``groups`` known to be in the group the tree made (the module
    docstring: a witness alive across the read of ``/proc``, else this planner's mark in its environment), and
    every child of a held process (with its group, where it leads one), read after read until one finds nothing
    new. The caller's own group ``mine`` is never one of them (a child of a held process in it is held alone)."""
    for _ in range(HOLD_ROUNDS):
        found = _all_processes()
        witnessed = _witnessed(held)  # alive after the read, and held (alive) before it: alive all through
        new = [
            seen
            for seen in found
            if seen.pid not in held
            and not seen.ended
            and (
                seen.parent in held
                or seen.group in witnessed & groups
                or (seen.group in groups and _carries(seen.pid, marks))
            )
        ]
        if not new:
            return
        for seen in new:
            _hold(seen, held)
            if seen.group == seen.pid != mine:  # a group a process of the tree made since it was read
                groups.add(seen.group)


def _kill_found(found: list[Seen], announced: list[int], marks: set[bytes], led: bool = False) -> list[Seen]:
    """SIGKILL every process of ``found`` and every member of the groups they and the ``announced`` pids name
    (:func:`_hold_groups`; with ``led``, only the groups one of ``found`` leads), each through its pidfd; returns
    every process killed (the caller's group never signalled as a group)."""
    held: dict[int, tuple[Seen, int]] = {}
    mine = os.getpgrp()
    try:
        for seen in found:
            _hold(seen, held)
        leaders = {seen.pid for seen in found}
        groups = {seen.group for seen, _ in held.values() if seen.group > 1 and (not led or seen.group in leaders)}
        named = {p for p in announced if p > 1} | groups
        _hold_groups(named - {mine}, held, marks, mine)
        for seen, handle in held.values():
            _kill_seen(seen, handle)
    finally:
        for _, handle in held.values():
            if handle >= 0:
                os.close(handle)
    return [seen for seen, _ in held.values()]


def kill_under(pid: int) -> None:
    """SIGKILL every process under ``pid`` and every member of the groups one of them leads (ninja's commands, a
    launcher's ranks), each through its pidfd, as :func:`kill_tree` does; no wait."""
    _kill_found(seen_under(pid), [], _marks(), led=True)


def _is_child(pid: int) -> bool:
    """Whether ``pid`` is this process's child not yet reaped (running or a zombie): its number, and its group's
    when it leads one, are held until this process reaps it. Asked without reaping (``WNOWAIT``)."""
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except (ChildProcessError, OSError):
        return False
    return True


def kill_tree(top: int, announced: list[int]) -> None:
    """SIGKILL ``top`` (a group leader), every process under it, every member of the groups they are in and of
    every announced pid's group; return once none of them is left but, where ``top`` is the caller's unreaped
    child, ``top``'s group (the caller reaps it, then :func:`wait_group_gone` of ``top``). Every process is
    signalled through its own pidfd, and a group by its number only where that number is ``top``'s while it is
    the caller's unreaped child (the module docstring: a member of a group is one known to be in the group the
    tree made, never in a successor of its number). A ``top`` that is not the caller's child (forked by the
    preloaded starter, or already reaped) is taken as its own only where it carries this planner's mark.

    The launcher starts every rank as a session leader (its pid is its group), so a rank that already exited
    still names the group its helpers were left in, though it is no longer under the launcher."""
    marks = _marks()
    ours = _is_child(top)
    if ours:
        signal_group(top, signal.SIGSTOP)
    leader = _stat(top)
    taken = ours or (leader is not None and _carries(top, marks))  # top's tree is this planner's to kill
    found = seen_under(top) if taken else []
    if leader is not None and taken:
        found = [leader, *found]
    killed = _kill_found(found, [*announced, top], marks)
    if ours:
        signal_group(top, signal.SIGKILL)
        signal_group(top, signal.SIGCONT)
    # the caller reaps ``top`` and then waits for its group (and its own group's are its own to reap); the others
    # are reaped by their parents (init)
    mine = os.getpgrp()
    _wait_gone([seen for seen in killed if seen.group != mine and not (ours and seen.group == top)])


def _wait_gone(processes: list[Seen]) -> None:
    """Wait until none of ``processes`` is left, as itself (its start time), even as a zombie: until reaped."""
    deadline = time.monotonic() + GROUP_GONE_S
    left = processes
    while left and time.monotonic() < deadline:
        left = [seen for seen in left if (now := _stat(seen.pid)) is not None and now.start == seen.start]
        if left:
            time.sleep(0.02)


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
