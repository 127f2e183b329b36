"""A heartbeat line while a long first-use step runs in this process (reading or tracing a local config on the
meta device: a minute and more for a large unknown architecture on a small CPU).

One line every ``MEMPLAN_PROGRESS_INTERVAL_S`` seconds (default 30; 0 turns it off), the variable ``planner
probe`` and ``tune`` read for theirs, with the elapsed time as theirs write it (``planner.progress``):
``memplan: still tracing olmo2: 1m30s``. The lines go to the caller's ``on_note`` (stderr when it gave none).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping

from planner.progress import elapsed_text, interval_s, stderr_note


class Heartbeat:
    """The lines of one step: :meth:`due` says one when ``interval`` seconds have passed since the last."""

    def __init__(self, what: str, on_note: Callable[[str], None], interval: float, clock: Callable[[], float]) -> None:
        self.what = what
        self.on_note = on_note
        self.interval = interval
        self.clock = clock
        self.started = clock()
        self.next_at = self.started + interval

    def due(self) -> bool:
        """Say the line if it is due (and schedule the next); True if one was said."""
        now = self.clock()
        if now < self.next_at:
            return False
        self.on_note(f"memplan: still {self.what}: {elapsed_text(now - self.started)}")
        self.next_at = now + self.interval
        return True


@contextlib.contextmanager
def heartbeat(
    what: str, on_note: Callable[[str], None] | None = None, env: Mapping[str, str] = os.environ
) -> Iterator[None]:
    """Say ``memplan: still <what>: <elapsed>`` every interval while the block runs (a daemon thread)."""
    interval = interval_s(env)
    if interval is None:
        yield
        return
    beat = Heartbeat(what, on_note if on_note is not None else stderr_note, interval, time.monotonic)
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
