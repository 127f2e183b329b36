"""One reading of ``/proc/PID/stat`` (proc(5)) for every part of memplan that names a process by it.

The line is ``pid (comm) state ppid pgrp ...``; the command name ``comm`` is whatever the process called itself
(up to 15 bytes, ``prctl(PR_SET_NAME)`` or ``/proc/PID/comm``), so it may hold spaces and parentheses: the fields
after it are read from the LAST ``)`` on, never by splitting the whole line. :func:`fields_after_command` is that
parse; :func:`read_stat_fields` reads a process's line and parses it. A process's start time (field 22, clock
ticks after boot) names it together with its pid, even once the pid is reused; :func:`started_at_utc` turns it into
a wall-clock time (boot time from ``/proc/stat``'s ``btime``) a user can match against a log. Pure Python, Linux;
elsewhere nothing is read (empty fields, None).
"""

from __future__ import annotations

import contextlib
import os
from datetime import UTC, datetime, timedelta

__all__ = [
    "GROUP",
    "PARENT",
    "START",
    "STATE",
    "boot_time_utc",
    "fields_after_command",
    "read_stat_fields",
    "started_at_utc",
]

# indices into fields_after_command's list: proc(5) fields 3 (state), 4 (ppid), 5 (pgrp) and 22 (starttime)
STATE, PARENT, GROUP, START = 0, 1, 2, 19


def fields_after_command(stat: bytes) -> list[bytes]:
    """The fields of a ``/proc/PID/stat`` line after the command name (``[STATE]`` first), split at the line's
    last ``)``: a command name such as ``a) b (c`` keeps its own parentheses. [] for what is not such a line
    (empty: the process is gone)."""
    head, paren, rest = stat.rpartition(b")")
    if not paren or b"(" not in head:
        return []
    return rest.split()


def read_stat_fields(pid: int, task: int | None = None) -> list[bytes]:
    """The fields after the command name of ``/proc/PID/stat`` (of its thread ``task`` where given), [] when the
    process is gone or cannot be read: ``os.read`` on a descriptor, half the CPU of ``Path.read_bytes`` where a
    scan reads every process's line many times a second."""
    path = f"/proc/{pid}/stat" if task is None else f"/proc/{pid}/task/{task}/stat"
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return []
    chunks: list[bytes] = []
    try:
        while chunk := os.read(fd, 4096):
            chunks.append(chunk)
    except OSError:
        return []
    finally:
        os.close(fd)
    return fields_after_command(b"".join(chunks))


def boot_time_utc() -> datetime | None:
    """When this machine booted (``btime`` of ``/proc/stat``, whole seconds), None where it cannot be read."""
    with contextlib.suppress(OSError, ValueError), open("/proc/stat", "rb") as lines:
        for line in lines:
            if line.startswith(b"btime "):
                return datetime.fromtimestamp(int(line.split()[1]), UTC)
    return None


def started_at_utc(start_ticks: int, boot: datetime | None = None) -> datetime | None:
    """The wall-clock time (UTC) of a process's start time ``start_ticks`` (clock ticks after boot, field 22),
    to the tick; ``boot``: the boot time (default :func:`boot_time_utc`). None where either is unknown."""
    boot = boot if boot is not None else boot_time_utc()
    try:
        ticks = os.sysconf("SC_CLK_TCK")
    except (AttributeError, ValueError, OSError):
        return None
    if boot is None or ticks <= 0:
        return None
    return boot + timedelta(seconds=start_ticks / ticks)
