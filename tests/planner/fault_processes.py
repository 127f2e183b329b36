"""What a planner process has started, found in ``/proc`` (the fault suite's oracle, ``test_faults``): every
process below it while it runs and every one whose environment carries its mark (``MEMPLAN_PLANNER_PID=<pid>``),
sampled every 50 ms, and the waits for a stage of its run (a module's process, a compiler)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from probes.process.parent_watch import PLANNER_PID_VARIABLE
from probes.process.proc_stat import PARENT, START, read_stat_fields
from store.processes import pid_alive

COMPILERS = (b"ninja", b"c++", b"g++", b"cc1plus")  # what building a DeepSpeed op runs


def _proc_read(pid: int, name: str) -> bytes:
    """``/proc/PID/NAME`` (b"" when the process is gone): ``os.read`` on a descriptor, half the CPU of a
    ``Path.read_bytes`` in a scan that reads one file of every process twenty times a second."""
    try:
        fd = os.open(f"/proc/{pid}/{name}", os.O_RDONLY)
    except OSError:
        return b""
    chunks: list[bytes] = []
    try:
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    except OSError:
        return b""
    finally:
        os.close(fd)
    return b"".join(chunks)


def stat_fields(pid: int) -> list[bytes]:
    """The fields of ``/proc/PID/stat`` after the command name (state, parent pid, ...; [] when gone): the one
    parser of that line (:func:`probes.process.proc_stat.fields_after_command`)."""
    return read_stat_fields(pid)


def start_time(pid: int) -> int:
    """When ``pid`` started (clock ticks since boot; 0 when gone): a pid and this name one process."""
    fields = stat_fields(pid)
    return int(fields[START]) if len(fields) > START else 0


def _pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def _marked(pid: int, needle: bytes) -> bool:
    """Whether ``pid`` runs with ``needle`` (``MEMPLAN_PLANNER_PID=<planner>``) in its environment."""
    return needle in _proc_read(pid, "environ").split(b"\0") and pid_alive(pid)


def _below(top: int, stats: dict[int, list[bytes]]) -> list[int]:
    """The processes below ``top`` in ``stats`` (each process's stat fields, by pid)."""
    children: dict[int, list[int]] = {}
    for pid, fields in stats.items():
        if len(fields) > PARENT:
            children.setdefault(int(fields[PARENT]), []).append(pid)
    found, todo = [], [top]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class Sampler:
    """Every process seen below the planner while it runs, and every one started with its mark, sampled
    every 50 ms while it runs: the ones that must all be gone once it has ended (each as pid and start time).

    One sample is one pass over ``/proc``: each process's stat (its parent and start time), and the environment
    of those started since the planner (only they can carry its mark). ``latest`` is the last sample's pids,
    which the waits for a stage read instead of scanning again."""

    def __init__(self, planner: int) -> None:
        self.planner, self.seen, self.done = planner, dict[int, int](), threading.Event()
        self.since = start_time(planner)
        self.needle = f"{PLANNER_PID_VARIABLE}={planner}".encode()
        self.latest: list[int] = []
        self.sample()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def sample(self) -> list[int]:
        stats = {pid: stat_fields(pid) for pid in _pids()}
        started = {pid: int(fields[START]) for pid, fields in stats.items() if len(fields) > START}
        marked = [pid for pid, start in started.items() if start >= self.since and _marked(pid, self.needle)]
        pids = _below(self.planner, stats) + marked
        for pid in pids:
            self.seen.setdefault(pid, started.get(pid, 0))
        self.latest = pids
        return pids

    def _run(self) -> None:
        while not self.done.wait(0.05) and pid_alive(self.planner):  # what outlives it: running() looks again
            self.sample()

    def running(self) -> list[int]:
        """What it saw (and sees now) that still runs."""
        self.sample()
        return [pid for pid, start in self.seen.items() if pid_alive(pid) and start_time(pid) == start]


def running_module(pids: list[int], module: str) -> bool:
    """Whether one of ``pids`` is a ``python [-u] -m module ...`` (not a launcher that will start one)."""
    for pid in pids:
        argv = _proc_read(pid, "cmdline").split(b"\0")
        if module.encode() in argv[1:4] and argv[argv.index(module.encode()) - 1] == b"-m":
            return True
    return False


def compiling(pids: list[int]) -> bool:
    """Whether one of ``pids`` is a compiler (:data:`COMPILERS`)."""
    return any(Path(_proc_read(pid, "cmdline").split(b"\0")[0].decode()).name.encode() in COMPILERS for pid in pids)


def wait_for(condition: Callable[[], bool], timeout_s: float) -> bool:
    """Whether ``condition`` came true within ``timeout_s`` seconds (looked at every 50 ms)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
