"""Show another command line for this process in ``ps`` and ``/proc/PID/cmdline`` (Linux).

A child forked from the preloaded starter (:mod:`probes.process.preload_server`) would otherwise keep the starter's
command line, so ``ps`` and whatever looks for a probe by its module (``python -m probes.step.child``) would not
see it for what it is. The kernel reads a process's command line from the memory its arguments were given in
(``arg_start`` to ``arg_end``, fields 48 and 49 of ``/proc/self/stat``, Linux 3.5+); this writes the new one there,
cut to that room and padded with NUL bytes, as ``setproctitle`` does.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path

__all__ = ["set_command_line"]

ARG_START_FIELD = 48  # 1-based fields of /proc/PID/stat (proc(5))
FIELDS_BEFORE_STATE = 2  # pid and (comm); the rest is split after comm's closing parenthesis


def _argument_area() -> tuple[int, int] | None:
    try:
        text = Path("/proc/self/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    fields = text[text.rfind(")") + 1 :].split()
    index = ARG_START_FIELD - FIELDS_BEFORE_STATE - 1
    if len(fields) <= index + 1:
        return None
    start, end = int(fields[index]), int(fields[index + 1])
    return (start, end) if 0 < start < end else None


def set_command_line(argv: Sequence[str]) -> bool:
    """Make ``argv`` this process's command line, cut to the room its first one had; False where it cannot."""
    area = _argument_area()
    if area is None:
        return False
    start, end = area
    room = end - start
    text = b"\0".join(part.encode() for part in argv)[: room - 1]
    ctypes.memmove(start, text + b"\0" * (room - len(text)), room)
    return True
