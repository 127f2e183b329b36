"""A sound lower bound of a replayed plan's peak reserved bytes, from its allocation stream without the allocator.

The replay (:func:`search.step.replayed.replay_step`) reports each phase's peak reserved bytes over the phase's
runs in the measured steps (all but the first), plus the bytes the phase holds outside torch's allocator. In
torch's caching allocator every live request sits in a block of at least its size inside a reserved segment
(``c10/cuda/CUDACachingAllocator.cpp``: ``round_size`` never rounds down, a block is never smaller than its
request), so reserved >= allocated >= the requested bytes alive at once, at every event. :func:`measured_live_floor`
is the largest requested bytes alive at once inside a measured phase run, plus that phase's bytes outside torch:
at most the replay's peak reserved, whatever the allocator setting.

The ``empty_cache`` policy adds ``EMPTY_CACHE`` events to a step's stream and nothing else
(:func:`search.streams.build.step_stream`): the requests and their order are the same, so the floor is one
number for every (``empty_cache``, allocator) variant of a step. A search uses it to skip replaying a variant
that cannot fit (:mod:`search.choose.confirm`).
"""

from __future__ import annotations

from dataclasses import replace

from search.coefficients import Coefficients
from search.rlhf.predict import rlhf_step
from search.single.predict import checked_step
from search.step.assemble import Step
from search.step.replayed import STEPS, stream_of
from search.streams.build import STEP_MARK, outside_torch
from store.alloc_stream import ALLOC, FREE, PHASE
from store.records import Hardware, RLHFStrategy, Strategy, Workload

FIRST_MEASURED = 2  # the replay reads phases from the second step on (search.step.replayed.replay_step)


def measured_live_floor(step: Step, empty_cache: str) -> int:
    """The most requested bytes alive at once in any measured phase run of ``step``'s stream, plus that phase's
    bytes outside torch's allocator: a lower bound of the replay's peak reserved (see the module docstring)."""
    stream = stream_of(step, empty_cache)
    outside = {phase.name: 0 for phase in step.phases}
    for phase in step.phases:
        outside[phase.name] = max(outside[phase.name], max(outside_torch(m) for m in phase.moments))
    measured_marks = {f"{STEP_MARK}{n}" for n in range(FIRST_MEASURED, STEPS + 1)}
    live: dict[int, int] = {}
    current = floor = 0
    in_measured = False
    phase_peak = -1  # -1: not inside a measured phase run
    phase_name = ""
    for op, key, size, _, _ in stream.events:
        if op == ALLOC:
            live[key] = size
            current += size
            if phase_peak >= 0 and current > phase_peak:
                phase_peak = current
        elif op == FREE:
            current -= live.pop(key, 0)
        elif op == PHASE:
            if phase_peak >= 0:
                floor = max(floor, phase_peak + outside.get(phase_name, 0))
            name = stream.phases[key]
            if name.startswith(STEP_MARK):
                in_measured = name in measured_marks
                phase_peak = -1
            elif in_measured and name in outside:
                phase_name, phase_peak = name, current
            else:
                phase_peak = -1
    if phase_peak >= 0:
        floor = max(floor, phase_peak + outside.get(phase_name, 0))
    return floor


def strategy_floor(
    workload: Workload, hardware: Hardware, coef: Coefficients, strategy: Strategy | RLHFStrategy
) -> int:
    """:func:`measured_live_floor` of ``strategy``'s step (single model or RLHF), once for all its
    ``empty_cache`` and allocator variants (the stream of the first variant asked, built or found in the
    replay's cache, stands for them all)."""
    policy_free = replace(strategy, empty_cache="never", allocator="default")
    known = _FLOORS.get((workload, hardware, coef, policy_free))
    if known is not None:
        return known
    if isinstance(strategy, RLHFStrategy):
        step = rlhf_step(workload, strategy, hardware, coef)
    else:
        step = checked_step(workload, strategy, hardware, coef)
    floor = _FLOORS[(workload, hardware, coef, policy_free)] = measured_live_floor(step, strategy.empty_cache)
    if len(_FLOORS) > FLOORS_KEPT:
        _FLOORS.pop(next(iter(_FLOORS)))
    return floor


FLOORS_KEPT = 4096
_FLOORS: dict[tuple[Workload, Hardware, Coefficients, Strategy | RLHFStrategy], int] = {}
