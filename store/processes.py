"""Processes on this host, as the operating system reports them: whether a pid still runs.

The ground floor, since every layer that owns a lock, a claim or a child asks it: the planner's file set and
tuning claims (``planner.files.file_set``, ``planner.tuning.claims``) and the probes' process guards
(``probes.process.jit_lock``, ``probes.process.parent_watch``, ``probes.process.workdir``).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["pid_alive"]


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` names a running process here (a zombie, killed and not yet reaped, is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError, IndexError):  # /proc/PID/stat: "pid (comm) state ...", proc(5)
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    return True
