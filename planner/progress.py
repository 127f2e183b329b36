"""The pieces every progress line of memplan shares: how often one comes and how elapsed time reads in it.

``MEMPLAN_PROGRESS_INTERVAL_S`` (default 30 seconds; 0 turns the lines off) sets the heartbeat of ``planner
probe`` and ``tune`` (``planner.cli.progress``) and of a long first use of a local config
(``planner.job.heartbeat``); both say the elapsed time as :func:`elapsed_text` writes it. A note goes to the
caller's ``on_note`` where it gave one, else to stderr (:func:`stderr_note`).
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Mapping

__all__ = ["DEFAULT_INTERVAL_S", "INTERVAL_ENV", "elapsed_text", "interval_s", "stderr_note"]

INTERVAL_ENV = "MEMPLAN_PROGRESS_INTERVAL_S"
DEFAULT_INTERVAL_S = 30.0


def interval_s(env: Mapping[str, str] = os.environ) -> float | None:
    """Seconds between heartbeats: ``MEMPLAN_PROGRESS_INTERVAL_S`` (default 30), None (no heartbeat) for 0 or
    less; an unreadable value is the default."""
    text = env.get(INTERVAL_ENV, "").strip()
    if not text:
        return DEFAULT_INTERVAL_S
    try:
        value = float(text)
    except ValueError:
        return DEFAULT_INTERVAL_S
    if not math.isfinite(value):
        return DEFAULT_INTERVAL_S
    return value if value > 0 else None


def elapsed_text(seconds: float) -> str:
    """``45s``, ``1m30s``, ``10m``, ``1h05m``."""
    whole = max(0, round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s" if secs else f"{minutes}m"
    return f"{secs}s"


def stderr_note(line: str) -> None:
    """Write one line on stderr now (nothing where stderr is closed: nowhere to say it)."""
    with contextlib.suppress(OSError, ValueError):
        print(line, file=sys.stderr, flush=True)
