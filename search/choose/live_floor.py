"""Sound lower bounds of a replayed plan's peak reserved bytes, from its allocation stream without the allocator.

The replay (:func:`search.step.replayed.replay_step`) reports each phase's peak reserved bytes over the phase's
runs in the measured steps (all but the first), plus the bytes the phase holds outside torch's allocator; a
plan fits when the replay without a device limit (:func:`search.step.finish.finish_step`) stays within the
usable bytes. Two floors of it, each at most the replay's peak reserved:

- :func:`measured_live_floor`, the same for every ``empty_cache`` and allocator variant of a step: in torch's
  caching allocator every live request sits in a block of at least its size inside a reserved segment
  (``c10/cuda/CUDACachingAllocator.cpp``: ``round_size`` never rounds down), so reserved >= allocated >= the
  requested bytes alive at once, at every event. It is the largest requested bytes alive at once inside a
  measured phase run, plus that phase's bytes outside torch.
- :func:`cached_floor`'s second, which knows the policy. Without a device limit a segment is released only by
  ``empty_cache`` (``release_cached_blocks``; the other releases, ``release_available_cached_blocks`` and the
  retry's ``release_cached_blocks``, run only after a cudaMalloc failed: :meth:`CachingAllocator.new_block`,
  torch's ``DeviceCachingAllocator::malloc``). A block serves only requests of its own pool (small for rounded
  sizes up to 1 MiB, ``get_pool``) and CUDA stream (``get_free_block`` searches the request's stream, and a
  split keeps it), and a segment's blocks all share its pool and stream. So, between two ``empty_cache``
  calls, the reserved bytes of each (stream, pool) never fall and are never below the bytes alive in it: at
  every event they are at least the most bytes alive in it since the last ``empty_cache`` (its live bytes
  right after that call included), and the reserved bytes at least the sum of these over the (stream, pool)
  pairs. What a phase leaves cached counts in the phases after it: under policy ``never`` (no ``empty_cache``
  but DeepSpeed's own) the blocks the forward's activations took are still reserved in the optimizer step.
  A ``FREE`` whose block is in use on another stream (``record_stream``) frees it no earlier: counting it
  freed at its event keeps the floor below.

A search uses the floor of a variant to skip replaying it when it cannot fit (:mod:`search.choose.confirm`):
:func:`strategy_floor`, the policy's own floor for ``never`` (issue 42: 1a's ZeRO-1/2 offload points replayed
their ``never`` variants, which overflow at 116 and 123 GiB), the live floor (:func:`cached_floor`'s first,
:func:`measured_live_floor`'s figure) for the others. Both hold for the replay on the stream's own CUDA streams
(the search's, ``streams=True``).
"""

from __future__ import annotations

from dataclasses import replace

from search.allocator.config import SMALL_SIZE
from search.coefficients import Coefficients
from search.rlhf.predict import rlhf_step
from search.single.predict import checked_step
from search.step.assemble import Step
from search.step.replayed import STEPS, marked_stream, step_key, stream_of
from search.streams.build import STEP_MARK, outside_torch
from store.alloc_stream import ALLOC, EMPTY_CACHE, FREE, PHASE, AllocStream
from store.records import Hardware, RLHFStrategy, Strategy, Workload

FIRST_MEASURED = 2  # the replay reads phases from the second step on (search.step.replayed.replay_step)


def _outside(step: Step) -> dict[str, int]:
    """Each phase's most bytes outside torch's allocator, by name (as the replay adds them)."""
    outside: dict[str, int] = {}
    for phase in step.phases:
        outside[phase.name] = max(outside.get(phase.name, 0), max(outside_torch(m) for m in phase.moments))
    return outside


def measured_live_floor(step: Step, empty_cache: str) -> int:
    """The most requested bytes alive at once in any measured phase run of ``step``'s stream, plus that phase's
    bytes outside torch's allocator: a lower bound of the replay's peak reserved (see the module docstring)."""
    stream = stream_of(step, empty_cache)
    outside = _outside(step)
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


def cached_floor(step: Step, empty_cache: str) -> tuple[int, int]:
    """(the floor of every policy, the floor of policy ``empty_cache``) of the replay's peak reserved, from one
    pass over ``step``'s stream under ``empty_cache`` (see the module docstring and :func:`stream_floors`)."""
    return stream_floors(stream_of(step, empty_cache), _outside(step))


def stream_floors(stream: AllocStream, outside: dict[str, int]) -> tuple[int, int]:
    """:func:`cached_floor` of a built ``stream`` (of :func:`search.step.replayed.marked_stream`: its second
    is policy ``never``'s); ``outside``: the bytes outside torch of each measured phase
    by name (a phase not named there is not read, as the replay reads only the step's phases).

    Requested bytes stand for the rounded ones (``round_size`` never rounds down, under any configuration), and
    a request's pool is its size's (``round_size`` keeps 1 MiB, a multiple of 512 and of every division, where
    it is). Between two ``empty_cache`` calls each (stream, pool)'s most bytes alive only grow, so the most of
    their sum over a phase run is its sum at the run's end or right before an ``empty_cache`` in it."""
    measured_marks = {f"{STEP_MARK}{n}" for n in range(FIRST_MEASURED, STEPS + 1)}
    held: dict[int, tuple[int, int]] = {}  # key -> (slot, bytes) of each live request
    live = [0, 0]  # slot (stream * 2 + 1 for the small pool) -> requested bytes alive
    high = [0, 0]  # slot -> the most requested bytes alive since the last empty_cache
    alive = 0  # the sum of ``live``
    live_floor = cached_floor = 0
    live_peak = cached_peak = -1  # -1: not inside a measured phase run
    phase_name = ""
    in_measured = False
    for op, key, size, on_stream, _ in stream.events:
        if op == ALLOC:
            if size:  # a 0-byte request gets the null handle: no block (CachingAllocator.malloc)
                slot = on_stream + on_stream + (size <= SMALL_SIZE)
                if slot >= len(live):
                    live.extend([0] * (slot + 1 - len(live)))
                    high.extend([0] * (slot + 1 - len(high)))
                held[key] = (slot, size)  # a key allocated again leaves its old block allocated, as the replay
                now = live[slot] = live[slot] + size
                if now > high[slot]:
                    high[slot] = now
                alive += size
                if alive > live_peak >= 0:
                    live_peak = alive
        elif op == FREE:
            slot_size = held.pop(key, None)
            if slot_size is not None:
                live[slot_size[0]] -= slot_size[1]
                alive -= slot_size[1]
        elif op == EMPTY_CACHE and not key:  # a marked call is a policy's (EVERY_PLACE), not made under never
            if cached_peak >= 0:
                cached_peak = max(cached_peak, sum(high))
            high = live.copy()
        elif op == PHASE:
            if cached_peak >= 0:
                bytes_outside = outside.get(phase_name, 0)
                live_floor = max(live_floor, live_peak + bytes_outside)
                cached_floor = max(cached_floor, max(cached_peak, sum(high)) + bytes_outside)
            name = stream.phases[key]
            if name.startswith(STEP_MARK):
                in_measured = name in measured_marks
                live_peak = cached_peak = -1
            elif in_measured and name in outside:
                phase_name, live_peak, cached_peak = name, alive, sum(high)
            else:
                live_peak = cached_peak = -1
    if cached_peak >= 0:
        bytes_outside = outside.get(phase_name, 0)
        live_floor = max(live_floor, live_peak + bytes_outside)
        cached_floor = max(cached_floor, max(cached_peak, sum(high)) + bytes_outside)
    return live_floor, cached_floor


def strategy_floor(
    workload: Workload, hardware: Hardware, coef: Coefficients, strategy: Strategy | RLHFStrategy
) -> int:
    """The floor of ``strategy``'s replay (single model or RLHF): for policy ``never`` the floor of what the
    step's phases leave cached, for the other policies the live floor; both from one pass over the step's
    stream for every policy (:func:`search.step.replayed.marked_stream`, the build its variants' replays share),
    kept for all its ``empty_cache`` and allocator variants."""
    key = (workload, hardware, coef, replace(strategy, empty_cache="never", allocator="default"))
    floors = _FLOORS.get(key)
    if floors is None:
        if isinstance(strategy, RLHFStrategy):
            step = rlhf_step(workload, strategy, hardware, coef)
        else:
            step = checked_step(workload, strategy, hardware, coef)
        built = step_key(step)  # strategies that differ beyond the step (an engine's knobs) share its floors
        floors = _BY_STEP.get(built)
        if floors is None:
            floors = _kept(_BY_STEP, built, stream_floors(marked_stream(step, built), _outside(step)))
        _kept(_FLOORS, key, floors)
    return floors[1] if strategy.empty_cache == "never" else floors[0]


def _kept(
    floors: dict[tuple[object, ...], tuple[int, int]], key: tuple[object, ...], value: tuple[int, int]
) -> tuple[int, int]:
    """``value`` kept under ``key`` in ``floors``, the oldest dropped past :data:`FLOORS_KEPT`."""
    floors[key] = value
    if len(floors) > FLOORS_KEPT:
        floors.pop(next(iter(floors)))
    return value


FLOORS_KEPT = 4096
# a step's (every policy's, ``never``'s) floors, by strategy and by what its stream is built from
_FLOORS: dict[tuple[object, ...], tuple[int, int]] = {}
_BY_STEP: dict[tuple[object, ...], tuple[int, int]] = {}
