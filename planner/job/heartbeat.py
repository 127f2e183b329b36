"""A heartbeat line on stderr while a long first-use step runs in this process (reading or tracing a local
config on the meta device: a minute and more for a large unknown architecture on a small CPU).

One line every ``MEMPLAN_PROGRESS_INTERVAL_S`` seconds (default 30; 0 turns it off), the variable
``planner probe`` and ``tune`` read for theirs (``planner.cli.progress``): ``memplan: still tracing olmo2: 1m30s``.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TextIO

INTERVAL_ENV = "MEMPLAN_PROGRESS_INTERVAL_S"
DEFAULT_INTERVAL_S = 30.0


def heartbeat_interval(env: Mapping[str, str] = os.environ) -> float | None:
    """Seconds between lines: the variable's value, the default when unset or unreadable, None for 0 or less."""
    text = env.get(INTERVAL_ENV, "").strip()
    try:
        value = float(text) if text else DEFAULT_INTERVAL_S
    except ValueError:
        return DEFAULT_INTERVAL_S
    if not math.isfinite(value):
        return DEFAULT_INTERVAL_S
    return value if value > 0 else None


class Heartbeat:
    """The lines of one step: :meth:`due` writes one when ``interval`` seconds have passed since the last."""

    def __init__(self, what: str, stream: TextIO, interval: float, clock: Callable[[], float]) -> None:
        self.what = what
        self.stream = stream
        self.interval = interval
        self.clock = clock
        self.started = clock()
        self.next_at = self.started + interval

    def due(self) -> bool:
        """Write the line if it is due (and schedule the next); True if one was written."""
        now = self.clock()
        if now < self.next_at:
            return False
        whole = round(now - self.started)
        minutes, seconds = divmod(whole, 60)
        shown = f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"
        with contextlib.suppress(OSError, ValueError):  # a closed stream: nowhere to say it
            print(f"memplan: still {self.what}: {shown}", file=self.stream, flush=True)
        self.next_at = now + self.interval
        return True


@contextlib.contextmanager
def heartbeat(what: str, stream: TextIO | None = None, env: Mapping[str, str] = os.environ) -> Iterator[None]:
    """Write ``memplan: still <what>: <elapsed>`` every interval while the block runs (a daemon thread)."""
    interval = heartbeat_interval(env)
    if interval is None:
        yield
        return
    beat = Heartbeat(what, stream if stream is not None else sys.stderr, interval, time.monotonic)
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(max(0.0, beat.next_at - beat.clock())):
            beat.due()

    thread = threading.Thread(target=run, name="memplan-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=1.0)
