"""Phases of a probe step: their names per workload, where ``empty_cache`` goes, and how each is measured.

Phase names per workload kind, in step order, are :data:`store.phases.PHASES` (sft: forward, backward,
optimizer_step; dpo adds reference_forward first; ppo: generation, scoring, actor_training,
critic_training; remax and grpo drop the critic).

Before the step phases the child reports ``startup`` (imports, process group) and ``setup`` (models and
engines); a failure there names that phase. A phase that repeats inside one step (the ``grad_accum``
micro-steps of a single-model step) is one measurement: its peak is the largest of its runs, its time
their sum. Over the measured steps (all but the warm-up steps, :mod:`probes.step.warmup`) a phase's peak is
the largest and its time the median; :meth:`PhaseClock.spread` gives the min / median / max of each
phase's time and of the step's (its phases' sum), so a reader sees how steady the measured steps were.

``empty_cache`` placement is the one table of :mod:`store.phases` (which the cost model and
``planner.runtime.EmptyCachePolicy`` read too): ``after-generation`` after ``generation``;
``after-inference`` after every inference phase (``generation``, ``scoring``, ``reference_forward``);
``after-phase`` after every phase; ``every-step`` after the optimizer steps, at the end of the step.
The call runs inside the phase it ends (its time counts there) and only on CUDA; on the CPU it is
recorded and skipped.

Measuring (:class:`PhaseClock`): on CUDA ``reset_peak_memory_stats`` at each phase start, then
``max_memory_allocated`` / ``max_memory_reserved``, ``memory_stats()["inactive_split_bytes.all.peak"]``,
the growth of ``num_alloc_retries`` and ``num_ooms``, and the time between two CUDA events. On the CPU
the :class:`probes.measure.tracker.LiveTensorTracker` peak (reserved = allocated) and ``time.perf_counter``.
While :attr:`PhaseClock.profiler` is set (the unmeasured step of :mod:`probes.step.profile`) each phase runs
inside its own profiler.

A tracker that records its allocation stream gets the markers of :mod:`store.stream_phases`: each phase's
name where it starts (with the peak reset, in one step), ``step`` or ``warmup-step`` where a step starts
and where each of its phases ends (with the peak read), and an EMPTY_CACHE event where ``empty_cache``
runs or, on the CPU, would run. Nothing here imports torch at module level.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from store.measurements import PhaseMeasurement
from store.phases import ALL_PHASES, EMPTY_CACHE_AFTER, END_STEP, INFERENCE_PHASES, PHASES, empties_after
from store.stream_phases import STEP_MARK, WARMUP_MARK

__all__ = ["EMPTY_CACHE_AFTER", "INFERENCE_PHASES", "PHASES", "END_STEP", "PhaseClock", "empties_after"]


class PhaseClock:
    """Runs and measures the phases of each step (see the module docstring).

    ``tracker`` is the CPU live-tensor tracker (None on CUDA); ``on_phase`` is called with each phase
    name as it starts (the child reports it to the parent, so a timeout names the phase).
    """

    def __init__(
        self,
        device: str,
        policy: str,
        tracker: Any = None,
        on_phase: Callable[[str], None] | None = None,
    ) -> None:
        self.device = device
        self.policy = policy
        self.tracker = tracker
        self.on_phase = on_phase
        self.current: str | None = None
        self.cache_calls = 0  # decisions to empty the cache (executed only on CUDA)
        self._step: dict[str, dict[str, float]] = {}
        self._steps: list[dict[str, dict[str, float]]] = []
        self._order: list[str] = []
        self._step_mark = STEP_MARK
        # a tracker that keeps an allocation stream takes markers (a bare one only resets its peak)
        self._marks = tracker is not None and hasattr(tracker, "mark_phase")
        self.profiler: Any = None  # a probes.step.profile.PhaseProfiler while the profiled step runs

    # --- steps ----------------------------------------------------------------------------------------

    def start_step(self, measured: bool = True) -> None:
        """Open a step; ``measured`` says whether :meth:`finish_step` will keep it (it names its stream markers)."""
        self._step = {}
        self._step_mark = STEP_MARK if measured else WARMUP_MARK
        if self._marks:
            self.tracker.mark_phase(self._step_mark)

    def finish_step(self, measured: bool) -> None:
        """Close the step; a measured step's phases enter the result (the warm-up's do not)."""
        if measured:
            self._steps.append(self._step)
        self._step = {}

    @property
    def measured_steps(self) -> int:
        return len(self._steps)

    def end_step(self) -> None:
        """The end of the step's optimizer steps: ``every-step`` empties the cache here (call it inside the
        step's last phase, so its time counts)."""
        self._empty_cache(END_STEP)

    # --- phases ---------------------------------------------------------------------------------------

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Run the block as phase ``name``; at its end, empty the cache where the policy says, then measure."""
        if name not in ALL_PHASES:
            raise ValueError(f"unknown phase {name!r}")
        self.current = name
        if self.on_phase is not None:
            self.on_phase(name)
        if name not in self._order:
            self._order.append(name)
        start = self._start()
        with self.profiler.phase(name) if self.profiler is not None else nullcontext():
            yield
        self._empty_cache(name)
        self._record(name, self._stop(start))
        self.current = None

    def _empty_cache(self, event: str) -> None:
        if not empties_after(self.policy, event):
            return
        self.cache_calls += 1
        if self._marks:
            self.tracker.mark_empty_cache()
        if self.device == "cuda":
            import torch

            torch.cuda.empty_cache()

    def _start(self) -> Any:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            stats = torch.cuda.memory_stats()
            begin = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            begin.record()
            return begin, end, stats
        if self._marks:
            self.tracker.mark_phase(self.current, reset_peak=True)
        elif self.tracker is not None:
            self.tracker.reset_peak()
        return time.perf_counter()

    def _stop(self, start: Any) -> dict[str, float]:
        if self.device == "cuda":
            import torch

            begin, end, before = start
            end.record()
            torch.cuda.synchronize()
            stats = torch.cuda.memory_stats()
            return {
                "allocated": torch.cuda.max_memory_allocated(),
                "reserved": torch.cuda.max_memory_reserved(),
                "inactive": stats.get("inactive_split_bytes.all.peak", 0),
                "retries": stats.get("num_alloc_retries", 0) - before.get("num_alloc_retries", 0),
                "ooms": stats.get("num_ooms", 0) - before.get("num_ooms", 0),
                "time": begin.elapsed_time(end) / 1000.0,
            }
        elapsed = time.perf_counter() - start
        if self._marks:
            peak = self.tracker.mark_phase(self._step_mark)  # the phase's peak, read where its window ends
        else:
            peak = self.tracker.peak if self.tracker is not None else 0
        return {"allocated": peak, "reserved": peak, "inactive": 0, "retries": 0, "ooms": 0, "time": elapsed}

    def _record(self, name: str, sample: dict[str, float]) -> None:
        """Fold one run of a phase into this step: largest peaks, summed time and counters."""
        seen = self._step.get(name)
        if seen is None:
            self._step[name] = dict(sample)
            return
        for key in ("allocated", "reserved", "inactive"):
            seen[key] = max(seen[key], sample[key])
        for key in ("retries", "ooms", "time"):
            seen[key] += sample[key]

    # --- results --------------------------------------------------------------------------------------

    def spread(self) -> dict[str, Any]:
        """Time spread over the measured steps: ``{"step_time_s": {"min", "median", "max", "steps"},
        "phase_time_s": {phase: [min, median, max]}}`` (seconds, rounded to 0.1 ms); empty without steps."""
        if not self._steps:
            return {}
        totals = [sum(run["time"] for run in step.values()) for step in self._steps]
        phases = {}
        for name in self._order:
            times = [step[name]["time"] for step in self._steps if name in step]
            if times:
                phases[name] = [_round(min(times)), _round(statistics.median(times)), _round(max(times))]
        step = {
            "min": _round(min(totals)),
            "median": _round(statistics.median(totals)),
            "max": _round(max(totals)),
            "steps": [_round(t) for t in totals],
        }
        return {"step_time_s": step, "phase_time_s": phases}

    def measurements(self) -> list[PhaseMeasurement]:
        """One PhaseMeasurement per phase, in the order the phases first ran, over the measured steps."""
        out = []
        for name in self._order:
            runs = [step[name] for step in self._steps if name in step]
            if not runs:
                continue
            out.append(
                PhaseMeasurement(
                    name=name,
                    peak_allocated_bytes=int(max(r["allocated"] for r in runs)),
                    peak_reserved_bytes=int(max(r["reserved"] for r in runs)),
                    time_s=float(statistics.median(r["time"] for r in runs)),
                    inactive_split_bytes=int(max(r["inactive"] for r in runs)),
                    alloc_retries=int(sum(r["retries"] for r in runs)),
                    num_ooms=int(sum(r["ooms"] for r in runs)),
                )
            )
        return out


def _round(seconds: float) -> float:
    return round(float(seconds), 4)
