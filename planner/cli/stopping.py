"""SIGTERM and SIGHUP stop the planner as Ctrl-C does, and nothing it started outlives it.

``timeout``, ``kill``, Slurm's ``scancel`` and Kubernetes send SIGTERM; a closed terminal sends SIGHUP.
Python's default for both is to end the process at once, which leaves a probe's child (a session of its
own, see :mod:`probes.process.isolation`) running, compiling, holding the GPU. :func:`stop_on_signals` (entered by
the ``planner`` process, :func:`planner.cli.run`) makes either signal raise :class:`Stopped` in the main
thread: a ``KeyboardInterrupt``, so every path that already handles Ctrl-C runs (the probe child's tree is
killed, its working folder removed, the probe run marked ``interrupted``, a tune's trial given back, a
half-written export put back). The process then exits with ``128 + signal number`` (143 for SIGTERM, 129 for
SIGHUP) after one line on stderr. A second signal while that cleanup runs ends the process at once (the
children end themselves when their parent dies: :mod:`probes.process.parent_watch`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["STOP_SIGNALS", "SignalStop", "Stopped", "stop_on_signals"]

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGHUP)


class Stopped(KeyboardInterrupt):
    """The planner received ``signum`` (SIGTERM, SIGHUP): unwinds as Ctrl-C does."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class SignalStop:
    """Which stop signal arrived (if any), and the exit code that follows from it."""

    def __init__(self) -> None:
        self.received: int | None = None

    def handle(self, signum: int, frame: FrameType | None) -> None:
        """The signal handler: the first signal raises :class:`Stopped`, a second one exits at once."""
        if self.received is not None:
            os._exit(128 + self.received)
        self.received = signum
        raise Stopped(signum)

    def finish(self, code: int) -> int:
        """``code``, or ``128 + signum`` after one line on stderr when a stop signal arrived."""
        if self.received is None:
            return code
        with contextlib.suppress(OSError, ValueError):  # a hung-up terminal: nowhere to say it
            name = signal.Signals(self.received).name
            print(f"planner: stopped by {name}; its probes were ended", file=sys.stderr, flush=True)
        return 128 + self.received


@contextmanager
def stop_on_signals(signals: tuple[signal.Signals, ...] = STOP_SIGNALS) -> Iterator[SignalStop]:
    """Within the block, ``signals`` raise :class:`Stopped` (a :class:`Stopped` that escapes the block, a
    signal that came after the command had finished, is swallowed); the previous handlers come back after it.
    Outside the main thread nothing is installed."""
    stop = SignalStop()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {sig: signal.signal(sig, stop.handle) for sig in signals}
    try:
        yield stop
    except Stopped:
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
