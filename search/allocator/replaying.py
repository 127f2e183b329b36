"""Replay an allocation stream through the caching allocator's rules, phase by phase.

The stream's events (:mod:`store.alloc_stream`) drive a fresh :class:`CachingAllocator`: ALLOC calls
``malloc`` and remembers the key's handle, FREE frees it (a key never allocated, or of a 0-byte request, is
ignored, as a tracker's ``live_peak`` ignores it; one with a pending use waits for its event), EVENT completes
the named event (``CachingAllocator.complete``), EMPTY_CACHE calls ``empty_cache``, PHASE closes the
running phase and opens the named one. A phase's peaks are torch's own peaks with
``reset_peak_memory_stats()`` called at its start, so they are exact per phase and their maximum is the
run's. An out-of-memory error ends the replay: the result and its last phase say ``oom``.
"""

from __future__ import annotations

from dataclasses import dataclass

from search.allocator.caching import AllocatorOOM, CachingAllocator
from search.allocator.config import AllocatorConfig
from store.alloc_stream import ALLOC, EMPTY_CACHE, EVENT, FREE, PHASE, AllocStream

Sample = tuple[int, int, int, int]  # (event index, requested, allocated, reserved) after that event


@dataclass(frozen=True)
class PhaseReplay:
    """One phase of a replay: the run of events from its PHASE marker to the next (bytes and counts).

    ``alloc_retries`` counts mallocs that had to release the whole cache and retry; ``cuda_mallocs`` and
    ``cuda_frees`` count device allocations and releases (with expandable segments, page maps and unmaps).
    """

    name: str
    peak_requested: int
    peak_allocated: int
    peak_reserved: int
    end_reserved: int
    end_allocated: int
    peak_inactive_split: int
    alloc_retries: int
    cuda_mallocs: int
    cuda_frees: int
    ooms: int
    oom: bool = False

    @property
    def fragmentation(self) -> int:
        """peak_reserved - peak_allocated: what the phase's reserved peak holds beyond its allocated peak."""
        return self.peak_reserved - self.peak_allocated


@dataclass(frozen=True)
class ReplayResult:
    """The phases of a replay, in order, and the run's peaks and counts.

    Events before the first PHASE marker form a phase named ``"start"``. ``oom_event`` is the index of the
    ALLOC event that ran out of memory (None when none did). ``timeline`` holds, when asked for, one
    :data:`Sample` per event (PHASE markers, the phase boundaries, included), for plotting.
    """

    phases: tuple[PhaseReplay, ...]
    peak_requested: int
    peak_allocated: int
    peak_reserved: int
    peak_inactive_split: int
    alloc_retries: int
    cuda_mallocs: int
    cuda_frees: int
    ooms: int
    oom: bool = False
    oom_event: int | None = None
    timeline: tuple[Sample, ...] = ()

    def phase(self, name: str) -> PhaseReplay:
        """The last phase called ``name`` (KeyError when none is)."""
        for phase in reversed(self.phases):
            if phase.name == name:
                return phase
        raise KeyError(name)


class _PhaseWindow:
    """Counters at a phase's start, to report the phase's own counts."""

    def __init__(self, name: str, allocator: CachingAllocator) -> None:
        stats = allocator.stats
        self.name = name
        self.start = (stats.num_alloc_retries, stats.num_device_alloc, stats.num_device_free, stats.num_ooms)
        allocator.reset_peak()

    def close(self, allocator: CachingAllocator, oom: bool) -> PhaseReplay:
        s = allocator.stats
        retries, mallocs, frees, ooms = self.start
        return PhaseReplay(
            name=self.name,
            peak_requested=s.requested_bytes.peak,
            peak_allocated=s.allocated_bytes.peak,
            peak_reserved=s.reserved_bytes.peak,
            end_reserved=s.reserved_bytes.current,
            end_allocated=s.allocated_bytes.current,
            peak_inactive_split=s.inactive_split_bytes.peak,
            alloc_retries=s.num_alloc_retries - retries,
            cuda_mallocs=s.num_device_alloc - mallocs,
            cuda_frees=s.num_device_free - frees,
            ooms=s.num_ooms - ooms,
            oom=oom,
        )


def replay(
    stream: AllocStream,
    config: AllocatorConfig = AllocatorConfig(),  # noqa: B008 (frozen, so one shared default is safe)
    device_bytes: int | None = None,
    timeline: bool = False,
) -> ReplayResult:
    """Replay ``stream`` through a fresh allocator with ``config`` on a device of ``device_bytes`` (None:
    unlimited); never raises for an out-of-memory request, which ends the replay with ``oom=True``."""
    allocator = CachingAllocator(config, device_bytes)
    stats = allocator.stats
    requested, allocated, reserved = stats.requested_bytes, stats.allocated_bytes, stats.reserved_bytes
    malloc, free = allocator.malloc, allocator.free
    handles: dict[int, int] = {}
    phases: list[PhaseReplay] = []
    samples: list[Sample] = []
    window = _PhaseWindow("start", allocator)
    events = stream.events
    # events before the first PHASE marker (there are some when the stream does not open with one) form "start"
    in_start, start_used = True, bool(events) and events[0][0] != PHASE
    oom_event: int | None = None
    for index, (op, key, size, on_stream, _kind) in enumerate(events):
        if op == ALLOC:
            try:
                handles[key] = malloc(size, on_stream)
            except AllocatorOOM:
                oom_event = index
                break
        elif op == FREE:
            handle = handles.pop(key, None)
            if handle is not None:
                free(handle, size)  # size: the event a pending use waits for (0: none)
        elif op == EMPTY_CACHE:
            allocator.empty_cache()
        elif op == EVENT:
            allocator.complete(key)
        elif op == PHASE:
            if not in_start or start_used:
                phases.append(window.close(allocator, oom=False))
            in_start = False
            name = stream.phases[key] if 0 <= key < len(stream.phases) else f"phase {key}"
            window = _PhaseWindow(name, allocator)
        if timeline:
            samples.append((index, requested.current, allocated.current, reserved.current))
    oom = oom_event is not None
    if oom and timeline:
        samples.append((oom_event or 0, requested.current, allocated.current, reserved.current))
    if not in_start or start_used:
        phases.append(window.close(allocator, oom=oom))
    return ReplayResult(
        phases=tuple(phases),
        peak_requested=max((p.peak_requested for p in phases), default=0),
        peak_allocated=max((p.peak_allocated for p in phases), default=0),
        peak_reserved=max((p.peak_reserved for p in phases), default=0),
        peak_inactive_split=max((p.peak_inactive_split for p in phases), default=0),
        alloc_retries=stats.num_alloc_retries,
        cuda_mallocs=stats.num_device_alloc,
        cuda_frees=stats.num_device_free,
        ooms=stats.num_ooms,
        oom=oom,
        oom_event=oom_event,
        timeline=tuple(samples),
    )
