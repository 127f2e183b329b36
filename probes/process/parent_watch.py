"""A probe's processes end with the planner that started them, however the planner ends.

The planner ends its probe children itself when it stops on an error, Ctrl-C, SIGTERM or SIGHUP
(:mod:`planner.cli.stopping`, :func:`probes.process.isolation.run_child`). When it cannot (SIGKILL, the OOM killer, a
crash), the children notice by themselves: :func:`watch_parent`, called first in every child the planner
starts (:mod:`probes.step.child`, :mod:`probes.ops.child`, the rank launcher through :mod:`probes.process.watched`),

- asks Linux for a signal when its parent dies (``prctl(PR_SET_PDEATHSIG, SIGTERM)``, through ctypes);
- handles SIGTERM (and SIGHUP) by ending its whole tree (:func:`end_tree`): every process under it, with
  the process groups they made (ninja's compile commands, a launcher's ranks), then its own group;
- starts a watch thread that does the same once its parent changes or the planner's pid
  (``MEMPLAN_PLANNER_PID``, set by :func:`probes.process.isolation.child_env`) no longer runs. The thread is the
  fallback where PDEATHSIG does not exist, and the one that still acts when the signal cannot: Linux sends it
  when the parent *thread* that started the child ends (not only the process), and a Python handler waits
  until the main thread is back in the interpreter (a rank blocked in a collective is not).

A rank's parent is the launcher, not the planner, so the planner's pid is watched as well as the parent.
Pure Python: no torch here.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from types import FrameType
from typing import NoReturn

from probes.process.process_tree import PLANNER_PID_VARIABLE, kill_under
from store.processes import pid_alive

__all__ = [
    "PLANNER_PID_VARIABLE",
    "POLL_S",
    "end_tree",
    "parent_is_gone",
    "set_child_subreaper",
    "set_parent_death_signal",
    "watch_parent",
]

POLL_S = 0.25  # how often the watch thread looks at its parent
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>, Linux 3.4+


def set_parent_death_signal(sig: int = signal.SIGTERM) -> bool:
    """Have Linux send ``sig`` to this process when its parent (thread) ends; False where it cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def set_child_subreaper() -> bool:
    """Make this process the reaper of every orphan under it (``prctl(PR_SET_CHILD_SUBREAPER)``): a daemon the
    program starts (double fork and ``setsid``) is then this process's child, not init's, and is found and ended
    with the rest of its tree. False where it cannot be (not Linux, or the call failed)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def end_tree() -> NoReturn:
    """SIGKILL every process under this one with the members of the process groups they are in (ninja's
    commands, a launcher's ranks), each through its pidfd, never a group by its number
    (:func:`probes.process.process_tree.kill_under`), then this process's own group (when it leads one: its
    number is its own) and itself."""
    me = os.getpid()
    for _ in range(2):  # a second pass for what was being started during the first
        kill_under(me)
    if os.getpgrp() == me:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(me, signal.SIGKILL)
    os.kill(me, signal.SIGKILL)
    os._exit(128 + signal.SIGKILL)  # not reached


def parent_is_gone(parent: int, planner: int) -> bool:
    """Whether this process's parent is no longer ``parent``, or the planner ``planner`` (0: none named) is gone."""
    return os.getppid() != parent or (planner > 0 and not pid_alive(planner))


def _on_signal(signum: int, frame: FrameType | None) -> None:
    end_tree()


def _watch(parent: int, planner: int, poll_s: float) -> None:
    while not parent_is_gone(parent, planner):
        time.sleep(poll_s)
    end_tree()


def watch_parent(env: Mapping[str, str] | None = None, poll_s: float = POLL_S) -> None:
    """End this process and everything under it when its parent or the planner ends (module docstring).

    Call it first, from the main thread: if the planner is already gone, this process ends here."""
    env = os.environ if env is None else env
    text = env.get(PLANNER_PID_VARIABLE, "")
    planner = int(text) if text.isdigit() else 0
    parent = os.getppid()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, _on_signal)
    set_parent_death_signal(signal.SIGTERM)
    if parent_is_gone(parent, planner):  # the planner ended before the signal was asked for
        end_tree()
    threading.Thread(target=_watch, args=(parent, planner, poll_s), name="memplan-parent-watch", daemon=True).start()
