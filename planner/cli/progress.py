"""Progress of probes as plain lines, where no live display shows (output to a pipe, a file, a CI log).

``planner probe`` shows a live progress bar on a terminal; elsewhere, and for ``planner tune`` always, the
progress is lines on stderr: one as each probe starts, with the time (ISO UTC) its process is started at, to match it
to a log (``probe 2/5: ZeRO-2, mb 4 x 2 (started 2026-11-29T18:59:34Z)``), then, while it runs, a
heartbeat every ``MEMPLAN_PROGRESS_INTERVAL_S`` seconds (default 30; 0 turns it off: ``planner.progress``)
counted from its start:
``  still running: 1m30s of at most 10m`` (the probe's timeout). A probe ends by its timeout at the latest: the
heartbeat stops a minute after it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from types import TracebackType
from typing import TextIO

from planner.progress import INTERVAL_ENV, elapsed_text, interval_s

# the interval and the elapsed time as every progress line of memplan has them (planner.progress)
__all__ = ["GRACE_S", "INTERVAL_ENV", "ProbeLines", "elapsed_text", "interval_s"]

GRACE_S = 60.0  # after its timeout, a probe's process group is killed: it has ended within this


def utc_now() -> datetime:
    """The wall clock's now, in UTC."""
    return datetime.now(UTC)


def started_text(moment: datetime) -> str:
    """``(started 2026-11-29T18:59:34Z)``: when a probe's process starts, ISO 8601 in UTC to the second."""
    return f"(started {moment.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ})"


class ProbeLines:
    """Plain progress lines on ``stream``: :meth:`start` writes one as a probe starts, stamped with the ``wall``
    clock's time (its process is started right after the line: the probe runs in a fresh process), and a background
    thread a heartbeat every ``interval`` seconds while it runs (none when ``interval`` is None). :meth:`note` writes
    a line between them. Use it as a context manager: leaving it stops the heartbeat."""

    def __init__(
        self,
        stream: TextIO,
        timeout_s: float,
        interval: float | None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = utc_now,
    ) -> None:
        self.stream = stream
        self.timeout_s = timeout_s
        self.interval = interval
        self.clock = clock
        self.wall = wall
        self._wake = threading.Condition()
        self._started: float | None = None  # when the running probe started
        self._next = 0.0  # when its next heartbeat is due
        self._closed = False
        self._thread: threading.Thread | None = None

    def _write(self, line: str) -> None:
        with contextlib.suppress(OSError, ValueError):  # a closed pipe or stream: nowhere to say it
            print(line, file=self.stream, flush=True)

    def note(self, line: str) -> None:
        """One line as it is."""
        with self._wake:
            self._write(line)

    def start(self, line: str) -> None:
        """A probe starts: its line with the time it starts at (:func:`started_text`), and the heartbeat counts
        from now."""
        with self._wake:
            self._write(f"{line} {started_text(self.wall())}")
            self._started = self.clock()
            if self.interval is None:
                return
            self._next = self._started + self.interval
            if self._thread is None:
                self._thread = threading.Thread(target=self._beat, name="memplan-progress", daemon=True)
                self._thread.start()
            self._wake.notify()

    def _beat(self) -> None:
        assert self.interval is not None
        with self._wake:
            while not self._closed:
                if self._started is None:
                    self._wake.wait()
                    continue
                remaining = self._next - self.clock()
                if remaining > 0:
                    self._wake.wait(remaining)
                    continue
                elapsed = self.clock() - self._started
                self._next += self.interval
                if elapsed <= self.timeout_s:
                    self._write(f"  still running: {elapsed_text(elapsed)} of at most {elapsed_text(self.timeout_s)}")
                elif elapsed <= self.timeout_s + GRACE_S:
                    self._write(f"  still running: {elapsed_text(elapsed)}, past its timeout: being stopped")

    def close(self) -> None:
        """Stop the heartbeat (it writes nothing after this returns)."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> ProbeLines:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
