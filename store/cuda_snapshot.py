"""CUDA allocator snapshots and allocation streams, both ways. Pure Python: no torch here.

A snapshot is what ``torch.cuda.memory._snapshot()`` returns after ``_record_memory_history()``: the
allocator's ``segments`` at the end and, per device, ``device_traces``: every action it took, in order,
as ``{"action", "addr", "size", "stream", "frames", ...}``.

:func:`snapshot_to_stream` reads a device's trace as an :class:`store.alloc_stream.AllocStream`:

- ``alloc`` is an ALLOC of the trace's ``size``. That is the size *requested*, before rounding: the
  caching allocator records ``orig_size`` (``CUDACachingAllocator.cpp``, ``alloc_found_block``:
  ``record_trace(TraceEntry::ALLOC, ptr, orig_size, ...)``; ``block->requested_size`` is the same number,
  and the rounded ``block->size`` appears only in the segments' blocks). A stream holds requested sizes
  too, so the numbers pass through unchanged and a replay applies the rounding itself.
- ``free_completed`` is the FREE: the moment the block is back in the pool for reuse (``free_requested``
  comes first and, for a block used on another stream, earlier; the allocator can reuse it only once
  completed). A free of an allocation from before the trace began is dropped (it was never an ALLOC).
- ``empty_cache`` (written by :func:`stream_to_snapshot`) is EMPTY_CACHE. torch's own traces have no such
  action: ``torch.cuda.empty_cache()`` shows as ``segment_free`` (``segment_unmap`` with expandable
  segments) of every cached segment that holds no live block. A run of such cudaFrees becomes one
  EMPTY_CACHE when, after it, no segment of the trace is left without a live block (what empty_cache
  leaves). A run that leaves free segments behind is the allocator releasing some of its cache to retry
  a cudaMalloc that failed, which a replay that knows the device's size does by itself: no event. With
  expandable segments every run of unmaps counts as an EMPTY_CACHE (pages are unmapped only there and on
  such a retry). The segments of a trace that began after they were allocated never count as free.
- ``segment_alloc``/``segment_free``/``segment_map``/``segment_unmap`` are listed by
  :func:`segment_events` (the cudaMalloc and cudaFree sizes, to compare with a replay);
  ``oom`` and ``snapshot`` carry no allocation.

Streams are numbered in order of appearance (0 is the default stream). ``frames`` are not kept.

:func:`stream_to_snapshot` goes the other way, so that a CPU probe's stream opens in PyTorch's memory
viewer (https://pytorch.org/memory_viz): ``alloc``, ``free_requested`` and ``free_completed`` entries with
addresses handed out one after the other (no reuse), ``empty_cache`` entries, no frames, and one segment
spanning every address with the blocks still live at the end. The phase markers and kinds go under the
extra key ``"memplan"``, which the viewer ignores and :func:`snapshot_to_stream` reads back.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

from store.alloc_stream import ALLOC, EMPTY_CACHE, FREE, KINDS, PHASE, AllocStream, Event

__all__ = ["SEGMENT_ACTIONS", "reserved_peak", "segment_events", "snapshot_to_stream", "stream_to_snapshot"]

SEGMENT_ACTIONS = ("segment_alloc", "segment_free", "segment_map", "segment_unmap")
_RELEASES = frozenset({"segment_free", "segment_unmap"})
_BLOCK_ROUND = 512  # torch's kMinBlockSize: the address step of stream_to_snapshot
_EXTRA_KEY = "memplan"


def device_trace(snapshot: dict[str, Any], device: int | None = None) -> list[dict[str, Any]]:
    """The trace of ``device`` (default: the first device with a non-empty trace; [] when none)."""
    traces = snapshot.get("device_traces") or []
    if device is not None:
        return list(traces[device]) if 0 <= device < len(traces) else []
    return next((list(trace) for trace in traces if trace), [])


def segment_events(snapshot: dict[str, Any], device: int | None = None) -> list[tuple[str, int]]:
    """The allocator's cudaMalloc/cudaFree in order: ``(action, size)`` for every ``segment_alloc``,
    ``segment_free``, ``segment_map`` and ``segment_unmap`` of the device's trace."""
    return [(e["action"], int(e["size"])) for e in device_trace(snapshot, device) if e.get("action") in SEGMENT_ACTIONS]


def reserved_peak(snapshot: dict[str, Any], device: int | None = None) -> int:
    """The most bytes the allocator held from CUDA at once over the trace (``max_memory_reserved`` over the
    recorded window): what was reserved when the trace began (the final segments less the trace's net
    cudaMalloc) plus the running sum of segment allocations and frees."""
    events = segment_events(snapshot, device)
    net = sum(size if action in ("segment_alloc", "segment_map") else -size for action, size in events)
    segments = snapshot.get("segments") or []
    wanted = device if device is not None else _first_device(snapshot)
    final = sum(int(s.get("total_size", 0)) for s in segments if s.get("device", wanted) == wanted)
    reserved = peak = final - net
    for action, size in events:
        reserved += size if action in ("segment_alloc", "segment_map") else -size
        peak = max(peak, reserved)
    return peak


def snapshot_to_stream(snapshot: dict[str, Any], device: int | None = None) -> AllocStream:
    """The allocation stream of a device's trace (see the module docstring for each action)."""
    reader = _TraceReader()
    trace = device_trace(snapshot, device)
    found = snapshot.get(_EXTRA_KEY)
    extra: dict[str, Any] = found if isinstance(found, dict) else {}
    markers: dict[int, list[str]] = {}
    for index, name in extra.get("phases", []):
        markers.setdefault(int(index), []).append(str(name))
    kinds = list(extra.get("kinds", []))
    allocs = 0
    run: list[str] = []  # the current run of segment releases
    for index, entry in enumerate(trace):
        action = entry.get("action")
        if run and (index in markers or action not in _RELEASES):
            reader.end_releases(run)
            run = []
        for name in markers.get(index, ()):
            reader.phase(name)
        if action in _RELEASES:
            reader.segment(entry)
            run.append(action)
            continue
        if action == "alloc":
            kind = kinds[allocs] if allocs < len(kinds) else 0
            allocs += 1
            reader.alloc(entry, kind if isinstance(kind, int) and 0 <= kind < len(KINDS) else 0)
        elif action == "free_completed":
            reader.free(entry)
        elif action == "empty_cache":
            reader.empty_cache()
        elif action in ("segment_alloc", "segment_map"):
            reader.segment(entry)
    if run:
        reader.end_releases(run)
    for index in sorted(i for i in markers if i >= len(trace)):
        for name in markers[index]:
            reader.phase(name)
    return AllocStream(tuple(reader.events), tuple(reader.phases))


class _TraceReader:
    """Turns trace entries into stream events, keeping the segments and their live blocks for the
    EMPTY_CACHE rule (module docstring)."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.phases: list[str] = []
        self.live: dict[int, tuple[int, int | None]] = {}  # address -> (key, segment start)
        self.streams: dict[int, int] = {0: 0}
        self.starts: list[int] = []  # segment starts, sorted
        self.segments: dict[int, list[int]] = {}  # start -> [size, live blocks]
        self.next_key = 1

    def alloc(self, entry: dict[str, Any], kind: int) -> None:
        addr = int(entry.get("addr", 0))
        stream = self.streams.setdefault(int(entry.get("stream", 0)), len(self.streams))
        segment = self._segment_of(addr)
        if segment is not None:
            self.segments[segment][1] += 1
        self.live[addr] = (self.next_key, segment)
        self.events.append((ALLOC, self.next_key, int(entry.get("size", 0)), stream, kind))
        self.next_key += 1

    def free(self, entry: dict[str, Any]) -> None:
        found = self.live.pop(int(entry.get("addr", 0)), None)
        if found is None:
            return  # allocated before the trace began
        key, segment = found
        if segment is not None and segment in self.segments:
            self.segments[segment][1] -= 1
        self.events.append((FREE, key, 0, 0, 0))

    def empty_cache(self) -> None:
        self.events.append((EMPTY_CACHE, 0, 0, 0, 0))

    def phase(self, name: str) -> None:
        if name not in self.phases:
            self.phases.append(name)
        self.events.append((PHASE, self.phases.index(name), 0, 0, 0))

    def segment(self, entry: dict[str, Any]) -> None:
        """Follow the segments: a cudaMalloc (or map) adds one, a cudaFree (or unmap) removes it."""
        addr, size = int(entry.get("addr", 0)), int(entry.get("size", 0))
        if entry.get("action") in ("segment_alloc", "segment_map"):
            if addr not in self.segments:
                bisect.insort(self.starts, addr)
            self.segments[addr] = [size, 0]
        elif addr in self.segments:
            del self.segments[addr]
            self.starts.remove(addr)

    def end_releases(self, run: Sequence[str]) -> None:
        """A run of cudaFrees (or unmaps) ended: an EMPTY_CACHE when it left no free segment behind."""
        if self.events and self.events[-1][0] == EMPTY_CACHE:
            return  # the cudaFrees of an empty_cache the trace names itself
        if "segment_unmap" in run or all(live > 0 for _, live in self.segments.values()):
            self.empty_cache()

    def _segment_of(self, addr: int) -> int | None:
        index = bisect.bisect_right(self.starts, addr) - 1
        if index < 0:
            return None
        start = self.starts[index]
        return start if addr < start + self.segments[start][0] else None


def _first_device(snapshot: dict[str, Any]) -> int:
    traces = snapshot.get("device_traces") or []
    return next((i for i, trace in enumerate(traces) if trace), 0)


def stream_to_snapshot(stream: AllocStream, device: int = 0) -> dict[str, Any]:
    """A minimal snapshot of ``stream`` that PyTorch's memory viewer opens (see the module docstring)."""
    trace: list[dict[str, Any]] = []
    live: dict[int, tuple[int, int]] = {}  # key -> (address, size)
    kinds: list[int] = []
    phases: list[list[Any]] = []
    top = 0
    for op, key, size, stream_id, kind in stream.events:
        if op == ALLOC:
            live[key] = (top, size)
            kinds.append(kind)
            trace.append(_entry("alloc", top, size, stream_id))
            top += max(_BLOCK_ROUND, -(-size // _BLOCK_ROUND) * _BLOCK_ROUND)
        elif op == FREE and key in live:
            addr, size = live.pop(key)
            trace.append(_entry("free_requested", addr, size, 0))
            trace.append(_entry("free_completed", addr, size, 0))
        elif op == EMPTY_CACHE:
            trace.append(_entry("empty_cache", 0, 0, 0))
        elif op == PHASE:
            phases.append([len(trace), stream.phases[key]])
    traces: list[list[dict[str, Any]]] = [[] for _ in range(device)] + [trace]
    return {
        "segments": [_segment(live, top, device)] if top else [],
        "device_traces": traces,
        _EXTRA_KEY: {"phases": phases, "kinds": kinds, "source": "memplan allocation stream"},
    }


def _entry(action: str, addr: int, size: int, stream: int) -> dict[str, Any]:
    return {"action": action, "addr": addr, "size": size, "stream": stream, "frames": []}


def _segment(live: dict[int, tuple[int, int]], top: int, device: int) -> dict[str, Any]:
    """One segment over every address handed out: the live blocks at the end, the gaps inactive."""
    blocks: list[dict[str, Any]] = []
    cursor = allocated = requested = 0
    for addr, size in sorted(live.values()):
        if addr > cursor:
            blocks.append({"size": addr - cursor, "requested_size": 0, "state": "inactive", "frames": []})
        rounded = max(_BLOCK_ROUND, -(-size // _BLOCK_ROUND) * _BLOCK_ROUND)
        blocks.append({"size": rounded, "requested_size": size, "state": "active_allocated", "frames": []})
        cursor = addr + rounded
        allocated += rounded
        requested += size
    if cursor < top:
        blocks.append({"size": top - cursor, "requested_size": 0, "state": "inactive", "frames": []})
    return {
        "device": device,
        "address": 0,
        "total_size": top,
        "stream": 0,
        "segment_type": "large",
        "segment_pool_id": (0, 0),
        "allocated_size": allocated,
        "active_size": allocated,
        "requested_size": requested,
        "blocks": blocks,
    }
