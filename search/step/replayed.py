"""Reserved memory of a step from the allocator's own rules: build its stream, replay it, read each phase.

:func:`replay_step` builds the step's allocation stream from the cost model's bytes
(:func:`search.streams.build.step_stream`) under an ``empty_cache`` policy and replays it through the port of
torch's caching allocator (:mod:`search.allocator`) with the strategy's allocator setting. Each phase's peak
reserved bytes, its inactive-split bytes (reserved but unusable), its allocation retries and its cudaMalloc
and cudaFree calls come from the replay of the measured steps; the ``empty_cache`` calls cost what
the replay says they make the allocator do: each released segment's cudaFree now and the cudaMalloc of
every segment the step then has to map again (:func:`empty_cache_seconds`). A search meets the same step
again (another allocator, a confirmation, the report): what it reads of a replay is kept by the digest of the
stream (steps built alike share one replay), without the stream; the streams kept to be replayed again are
bounded by their events (:data:`STREAM_EVENTS_KEPT`), so what a long-running process holds stays bounded
whatever the jobs it plans (:class:`search.step.weighed_cache.WeighedCache`).
"""

from __future__ import annotations

import hashlib
import marshal
from dataclasses import dataclass, replace

from search.allocator import AllocatorConfig, PhaseReplay, ReplayResult, replay
from search.coefficients import Coefficients
from search.step.assemble import Step
from search.step.weighed_cache import WeighedCache
from search.streams.build import EVERY_PLACE, STEP_MARK, outside_torch, step_stream
from search.streams.phases import StepPhase
from store.alloc_stream import EMPTY_CACHE, PHASE, AllocStream
from store.phases import EMPTY_CACHE_AFTER, END_STEP

STEPS = 3  # built and replayed: one warm-up step, then the measured ones (reserved may still grow in the second)
ALLOCATOR_CONFIGS = {
    "default": AllocatorConfig(),
    "expandable-segments": AllocatorConfig(expandable_segments=True),
}


@dataclass(frozen=True)
class PhaseReplayed:
    """What the replay says of one phase of the measured step (its runs taken together)."""

    reserved: int  # peak reserved bytes in torch's allocator, plus the bytes outside it (hybrid engine)
    allocated: int  # peak allocated (rounded) bytes in torch's allocator, plus the bytes outside it
    inactive_split: int  # peak bytes of free blocks inside split segments (unusable for larger requests)
    alloc_retries: int  # failed cudaMallocs that freed the cache and tried again
    cuda_mallocs: int
    cuda_frees: int


@dataclass(frozen=True)
class StepReplayed:
    """The replayed phases (in the step's phase order) and the seconds the empty_cache calls cost."""

    phase_names: tuple[str, ...]
    phases: tuple[PhaseReplayed, ...]
    cache_seconds: float
    events: int  # events replayed (the stream's length)
    init_allocated: int  # allocated bytes once the engines are built (torch.cuda.memory_allocated())
    init_reserved: int  # reserved bytes once the engines are built (torch.cuda.memory_reserved())
    oom_phase: str = ""  # where the allocator ran out of the device's memory ("" when it did not)
    # peak reserved while the engines are built (a model loaded whole before ZeRO-3 partitions it peaks here)
    init_peak_reserved: int = 0

    @property
    def peak_reserved(self) -> int:
        return max(p.reserved for p in self.phases)

    def to_dict(self) -> dict[str, object]:
        """The JSON shape: bytes as integers, per phase in step order."""
        return {
            "peak_reserved_bytes": self.peak_reserved,
            "after_init_allocated_bytes": self.init_allocated,
            "after_init_reserved_bytes": self.init_reserved,
            "init_peak_reserved_bytes": self.init_peak_reserved,
            "empty_cache_s": self.cache_seconds,
            "events": self.events,
            "oom_phase": self.oom_phase,
            "phases": [
                {
                    "name": name,
                    "peak_allocated_bytes": p.allocated,
                    "peak_reserved_bytes": p.reserved,
                    "inactive_split_bytes": p.inactive_split,
                    "alloc_retries": p.alloc_retries,
                    "cuda_mallocs": p.cuda_mallocs,
                    "cuda_frees": p.cuda_frees,
                }
                for name, p in zip(self.phase_names, self.phases, strict=True)
            ],
        }


def empty_cache_seconds(frees: int, mallocs_after: int, calls: int, coef: Coefficients) -> float:
    """An ``empty_cache`` policy's cost: its calls (a device synchronize each), the cudaFree of every
    segment they release and the cudaMalloc of every segment the step must then make again."""
    return calls * coef.empty_cache_call_s + frees * coef.cuda_free_s + mallocs_after * coef.cuda_malloc_s


def _outside(phase: StepPhase) -> int:
    """The most bytes a phase holds outside torch's allocator (the hybrid engine's workspace and KV cache)."""
    return max(outside_torch(m) for m in phase.moments)


def _calls_in_last_step(stream: AllocStream) -> int:
    """The ``empty_cache`` calls of the last step."""
    last = stream.phases.index(f"{STEP_MARK}{STEPS}")
    calls, inside = 0, False
    for op, key, _, _, _ in stream.events:
        if op == PHASE and stream.phases[key].startswith(STEP_MARK):
            inside = key == last
        elif op == EMPTY_CACHE and inside:
            calls += 1
    return calls


# A stream costs about 88 bytes of Python objects per event (a 5-tuple and its distinct ints: 300 PPO streams of
# opt-1.3b with opt-350m critic and reward, 16.2 M events, held 1.42 GB of RSS): 2 M events are ~170 MB, a few
# dozen streams of a large RLHF step or hundreds of a small one, more than a search meets again before it moves on.
STREAM_EVENTS_KEPT = 2_000_000
STEPS_SEEN = 16384  # steps whose stream's digest is known (a key and 3 ints each: the stream is not kept)
# Replay results hold no stream, one PhaseReplay (~0.6 kB) per phase run: 100,000 runs are ~60 MB, thousands of
# plans (a PPO step's three replayed steps are a few dozen runs).
REPLAY_PHASES_KEPT = 100_000


@dataclass(frozen=True)
class _Seen:
    """What :func:`replay_step` reads of a step's stream besides its replay, kept without the stream."""

    digest: bytes  # of the stream's events and phase names: steps built alike share one replay
    events: int  # the stream's length
    cache_calls: int  # the ``empty_cache`` calls of its last step


_STREAMS: WeighedCache[tuple[object, ...], AllocStream] = WeighedCache(STREAM_EVENTS_KEPT, len)
_SEEN: WeighedCache[tuple[object, ...], _Seen] = WeighedCache(STEPS_SEEN, lambda _: 1)
_REPLAYS: WeighedCache[tuple[object, ...], ReplayResult] = WeighedCache(REPLAY_PHASES_KEPT, lambda r: len(r.phases))


def _stream_key(step: Step, empty_cache: str) -> tuple[object, ...]:
    """Everything the stream is built from (:func:`search.streams.build.step_stream`), not the seconds: a
    calibration that moves only rates meets the same stream again."""
    phases = tuple(replace(phase, time_s=0.0) for phase in step.phases)
    repeats = tuple(sorted(step.repeats.items()))
    return (tuple(step.resident.items()), step.resident_sizes, step.engines, phases, repeats, empty_cache)


def _built(key: tuple[object, ...], step: Step, empty_cache: str) -> AllocStream:
    """The stream ``key`` names (:func:`_stream_key` of ``step`` and ``empty_cache``), from the step's one
    build for every policy (:func:`marked_stream`): a step's ``empty_cache`` variants share it."""
    stream = _STREAMS.get(key)
    if stream is None:
        stream = policy_stream(_marked(key[:-1], step), step, empty_cache)
        _STREAMS.put(key, stream)
    return stream


def _marked(key: tuple[object, ...], step: Step) -> AllocStream:
    marked_key = (*key, EVERY_PLACE)
    stream = _STREAMS.get(marked_key)
    if stream is None:
        stream = step_stream(
            step.resident, dict(step.resident_sizes), step.engines, step.phases, step.repeats, EVERY_PLACE, STEPS
        )
        _STREAMS.put(marked_key, stream)
    return stream


def step_key(step: Step) -> tuple[object, ...]:
    """What every policy's stream of ``step`` is built from (:func:`_stream_key` but the policy): steps with
    equal keys have equal streams under every policy."""
    return _stream_key(step, EVERY_PLACE)[:-1]


def marked_stream(step: Step, key: tuple[object, ...] | None = None) -> AllocStream:
    """``step``'s stream with a marked ``empty_cache`` call at every place a policy may make one and DeepSpeed's
    own calls unmarked (:data:`search.streams.build.EVERY_PLACE`), built once for all its policies (``key``:
    :func:`step_key` of ``step``, where the caller has it)."""
    return _marked(step_key(step) if key is None else key, step)


def policy_stream(marked: AllocStream, step: Step, empty_cache: str) -> AllocStream:
    """The stream of ``step`` under ``empty_cache`` from its :func:`marked_stream`: the policy's marked calls kept
    (as plain calls), the others dropped; the same events as ``step_stream`` builds under the policy."""
    after = EMPTY_CACHE_AFTER[empty_cache]
    names = [phase.name for phase in step.phases]
    kept = {mark for mark in range(1, len(names) + 1) if names[mark - 1] in after}
    if END_STEP in after:
        kept.add(-1)
    plain = (EMPTY_CACHE, 0, 0, 0, 0)
    events = tuple(
        event if event[0] != EMPTY_CACHE or not event[1] else plain
        for event in marked.events
        if event[0] != EMPTY_CACHE or not event[1] or event[1] in kept
    )
    return AllocStream(events, marked.phases)


def stream_of(step: Step, empty_cache: str) -> AllocStream:
    """The allocation stream of ``step``'s engine init and :data:`STEPS` steps under ``empty_cache`` (built
    once for each different step: the last used, up to :data:`STREAM_EVENTS_KEPT` events, are kept)."""
    return _built(_stream_key(step, empty_cache), step, empty_cache)


def _digest(stream: AllocStream) -> bytes:
    """A digest (BLAKE2b, 20 bytes) of the stream's events and phase names in marshal's format 2, which has no
    back-references: equal streams give equal bytes, and equal bytes are equal streams (they load back as one)."""
    return hashlib.blake2b(marshal.dumps((stream.events, stream.phases), 2), digest_size=20).digest()


def _seen(key: tuple[object, ...], step: Step, empty_cache: str) -> _Seen:
    seen = _SEEN.get(key)
    if seen is None:
        stream = _built(key, step, empty_cache)
        seen = _Seen(_digest(stream), len(stream), _calls_in_last_step(stream))
        _SEEN.put(key, seen)
    return seen


def _replay(
    seen: _Seen,
    key: tuple[object, ...],
    step: Step,
    empty_cache: str,
    streams: bool,
    allocator: str,
    device_bytes: int | None,
) -> ReplayResult:
    """The replay of the stream ``key`` names (``key`` is :func:`_stream_key` of ``step`` and ``empty_cache``,
    ``seen`` what is known of its stream), kept by the stream's digest for the next caller: under a device
    limit, the unlimited replay when no cudaMalloc went beyond it."""
    config = ALLOCATOR_CONFIGS[allocator]
    if device_bytes is not None and not config.garbage_collection_threshold:
        unlimited = _replay(seen, key, step, empty_cache, streams, allocator, None)
        if unlimited.peak_reserved <= device_bytes:
            return unlimited  # no cudaMalloc went beyond the device: the limit changes nothing
    replay_key = (seen.digest, streams, allocator, device_bytes)
    result = _REPLAYS.get(replay_key)
    if result is None:
        stream = _built(key, step, empty_cache)
        result = replay(stream if streams else stream.on_one_stream(), config, device_bytes)
        _REPLAYS.put(replay_key, result)
    return result


def replay_step(
    step: Step,
    empty_cache: str,
    allocator: str,
    coef: Coefficients,
    device_bytes: int | None = None,
    streams: bool = True,
) -> StepReplayed:
    """Replay ``step`` (a :class:`search.step.assemble.Step`) under a policy and an allocator setting.

    A phase's peaks are the largest over the measured steps (all but the first, as a probe measures); its
    counts (cudaMalloc, cudaFree, retries) are those of the last step, the steady cost of every step. With
    ``device_bytes`` (what torch's allocator may take: the GPU less the CUDA context and the bytes outside
    it) a cudaMalloc beyond it frees the cache and retries, as torch does, and one that still fails ends the
    replay: ``oom_phase`` names where, and the phases not reached count the whole device as reserved.
    ``streams=False`` replays every request on the default stream (a device without side streams)."""
    outside = max(_outside(phase) for phase in step.phases)
    limit = None if device_bytes is None else max(0, device_bytes - outside)
    key = _stream_key(step, empty_cache)
    seen = _seen(key, step, empty_cache)
    result = _replay(seen, key, step, empty_cache, streams, allocator, limit)
    phases = step.phases
    names = [phase.name for phase in phases]
    measured: dict[str, list[PhaseReplay]] = {name: [] for name in names}
    last: dict[str, list[PhaseReplay]] = {name: [] for name in names}
    number = 0
    setup = result.phases[0]  # the engines' init, up to the first step's marker
    for window in result.phases:
        if window.name.startswith(STEP_MARK):
            number = int(window.name.removeprefix(STEP_MARK))
        elif number >= 2 and window.name in measured:
            measured[window.name].append(window)
            if number == STEPS:
                last[window.name].append(window)
    out = []
    frees = mallocs = 0
    oom_phase = result.phases[-1].name if result.oom else ""
    for phase in phases:
        runs, steady = measured[phase.name], last[phase.name]
        outside = _outside(phase)
        if not runs:  # never reached: the replay ran out of memory before
            full = (limit or 0) + outside
            out.append(PhaseReplayed(full, full, 0, 0, 0, 0))
            continue
        out.append(
            PhaseReplayed(
                reserved=max(w.peak_reserved for w in runs) + outside,
                allocated=max(w.peak_allocated for w in runs) + outside,
                inactive_split=max(w.peak_inactive_split for w in runs),
                alloc_retries=sum(w.alloc_retries for w in steady),
                cuda_mallocs=sum(w.cuda_mallocs for w in steady),
                cuda_frees=sum(w.cuda_frees for w in steady),
            )
        )
        frees += out[-1].cuda_frees
        mallocs += out[-1].cuda_mallocs
    seconds = empty_cache_seconds(frees, mallocs, seen.cache_calls, coef)
    return StepReplayed(
        phase_names=tuple(names),
        phases=tuple(out),
        cache_seconds=seconds,
        events=seen.events,
        init_allocated=setup.end_allocated,
        init_reserved=setup.end_reserved,
        oom_phase=oom_phase,
        init_peak_reserved=setup.peak_reserved,
    )


@dataclass(frozen=True)
class StepTimeline:
    """Allocated and reserved bytes over the measured step, event by event, for a picture."""

    # (event index, allocated, reserved), one per event; allocated as a Prediction counts it (the live tensors'
    # requested bytes, search.step.assemble.assemble), not the allocator's blocks with their rounding remainders
    samples: tuple[tuple[int, int, int], ...]
    phases: tuple[tuple[int, str], ...]  # (event index, phase name) where each phase run starts
    empty_cache: tuple[int, ...]  # event indices of the empty_cache calls
    outside: int  # bytes held outside torch's allocator at their most (drawn as a constant band)
    # the bytes outside torch's allocator of each phase run in ``phases`` (a rollout engine's turn holds its
    # awake engine, the trainer's phases the sleeping one): drawn phase by phase where given
    phase_outside: tuple[int, ...] = ()


def step_timeline(step: Step, empty_cache: str, allocator: str) -> StepTimeline:
    """The replay of ``step``'s last step, sample by sample (see :class:`StepTimeline`)."""
    stream = stream_of(step, empty_cache)
    result = replay(stream, ALLOCATOR_CONFIGS[allocator], timeline=True)
    start = next(
        i
        for i, (op, key, _, _, _) in enumerate(stream.events)
        if op == PHASE and stream.phases[key] == f"{STEP_MARK}{STEPS}"
    )
    samples = tuple((i, requested, reserved) for i, requested, _, reserved in result.timeline if i >= start)
    marks = tuple(
        (i, stream.phases[key])
        for i, (op, key, _, _, _) in enumerate(stream.events)
        if i > start and op == PHASE and not stream.phases[key].startswith(STEP_MARK)
    )
    calls = tuple(i for i, event in enumerate(stream.events) if i > start and event[0] == EMPTY_CACHE)
    by_name: dict[str, int] = {}
    for phase in step.phases:
        by_name[phase.name] = max(by_name.get(phase.name, 0), _outside(phase))
    outside = tuple(by_name.get(name, 0) for _, name in marks)
    return StepTimeline(samples, marks, calls, max(_outside(phase) for phase in step.phases), outside)
