"""Phase windows of a recorded allocation stream: where each probe phase starts and ends, and its live peak.

A CPU probe (:mod:`probes.measure.tracker`, :mod:`probes.step.phases`) marks its stream with PHASE events:

- ``"setup"`` before the models and engines are built;
- each step phase's name (``forward``, ``generation``, ...) where the phase starts, the moment the probe
  resets its peak;
- :data:`STEP_MARK` (a measured step) or :data:`WARMUP_MARK` (a warm-up step) where a step starts and
  again where each of its phases ends, the moment the probe reads the phase's peak. What runs between two
  phases (a new batch, freeing the outputs) falls in these stretches, never in a phase's window.

A phase's window runs from its marker to the next marker. Its live peak is the most requested bytes alive
at once within it, counting what was alive when it opened; over the measured steps (the windows of
phases in a :data:`STEP_MARK` step) the largest of these is what the probe stored as the phase's
``peak_allocated_bytes``. Pure Python; the stream format is :mod:`store.alloc_stream`.
"""

from __future__ import annotations

from store.alloc_stream import ALLOC, FREE, PHASE, AllocStream

__all__ = ["STEP_MARK", "WARMUP_MARK", "SETUP_MARK", "MARKS", "phase_live_peaks"]

SETUP_MARK = "setup"
STEP_MARK = "step"
WARMUP_MARK = "warmup-step"
MARKS = frozenset({STEP_MARK, WARMUP_MARK})  # markers of the stretches between phases


def phase_live_peaks(stream: AllocStream, measured_only: bool = True) -> dict[str, int]:
    """The live peak of each phase name over its windows (see the module docstring), in first-seen order.

    ``measured_only`` leaves out the windows of warm-up steps (those after a :data:`WARMUP_MARK`, until the
    next :data:`STEP_MARK`); the between-phase stretches themselves are never reported.
    """
    peaks: dict[str, int] = {}
    live: dict[int, int] = {}
    current = 0
    name: str | None = None  # the open window's phase (None before the first marker or in a stretch)
    window_peak = 0
    warmup = False
    for op, key, size, _, _ in stream.events:
        if op == ALLOC:
            live[key] = size
            current += size
            if current > window_peak:
                window_peak = current
        elif op == FREE:
            current -= live.pop(key, 0)
        elif op == PHASE:
            _close(peaks, name, window_peak)
            marker = stream.phases[key]
            if marker in MARKS:
                warmup = marker == WARMUP_MARK
                name = None
            else:
                name = None if (measured_only and warmup) else marker
            window_peak = current
    _close(peaks, name, window_peak)
    return peaks


def _close(peaks: dict[str, int], name: str | None, peak: int) -> None:
    if name is not None:
        peaks[name] = max(peaks.get(name, 0), peak)
