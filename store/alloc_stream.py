"""Allocation streams: the ordered allocations and frees of a run, as torch's caching allocator sees them.

A stream is data, shared by who records it (the CPU probe tracker, :mod:`probes.measure.tracker`), who builds it
from a plan's cost terms (:mod:`search.streams`) and who replays it through the allocator's rules
(:mod:`search.allocator`). An event is a plain tuple, so a step of a large plan (thousands of events) is
cheap to build, hash and replay:

- ``(ALLOC, key, size, stream, kind)``: a request of ``size`` bytes (as asked, before any rounding) on
  CUDA stream ``stream`` (0 is the default stream); ``key`` names the tensor storage until it is freed;
  ``kind`` indexes :data:`KINDS` (what made it).
- ``(FREE, key, event, 0, 0)``: the storage ``key`` is released to the allocator; a nonzero ``event`` says it
  is still in use on another stream (``record_stream``) until that stream's work up to ``event`` has run.
- ``(EVENT, event, 0, 0, 0)``: that stream's work up to ``event`` (a positive int, counted up by the builder)
  has run: the blocks waiting for it may be reused (a stream or device synchronize names the last event).
- ``(EMPTY_CACHE, 0, 0, 0, 0)``: ``torch.cuda.empty_cache()``.
- ``(PHASE, index, 0, 0, 0)``: the phase ``phases[index]`` starts here (a probe's or a step's phase name).

:func:`encode` and :func:`decode` turn a stream into compact bytes and back (what a probe stores).
"""

from __future__ import annotations

import json
import struct
import sys
import zlib
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain

ALLOC, FREE, EMPTY_CACHE, PHASE, EVENT = 0, 1, 2, 3, 4
Event = tuple[int, int, int, int, int]  # (op, key, size, stream, kind)

# What made an allocation (the breakdown's names where they exist).
KINDS = (
    "other",
    "parameters",
    "gradients",
    "optimizer_states",
    "buffers",  # DeepSpeed's buckets, flattened partitions' copies, offload staging
    "zero3_gathered",
    "activations",
    "logits",
    "kv_cache",
    "hybrid_engine",
)
KIND_INDEX = {name: i for i, name in enumerate(KINDS)}


@dataclass(frozen=True)
class AllocStream:
    """An ordered stream of allocator events and the phase names its PHASE events point at."""

    events: tuple[Event, ...]
    phases: tuple[str, ...] = ()

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)

    def __len__(self) -> int:
        return len(self.events)

    def on_one_stream(self) -> AllocStream:
        """The same events with every request on the default stream: what a device without streams does
        (DeepSpeed's CPU accelerator is a synchronized device; it makes no side streams, so no use is pending)."""
        return AllocStream(
            tuple(
                (op, key, 0 if op == FREE else size, 0, kind) for op, key, size, _, kind in self.events if op != EVENT
            ),
            self.phases,
        )

    def live_peak(self) -> int:
        """The most requested bytes alive at once (what a live-tensor tracker reports as its peak)."""
        live: dict[int, int] = {}
        current = peak = 0
        for op, key, size, _, _ in self.events:
            if op == ALLOC:
                live[key] = size
                current += size
                peak = max(peak, current)
            elif op == FREE:
                current -= live.pop(key, 0)
        return peak


class StreamBuilder:
    """Builds an :class:`AllocStream` event by event; keys are handed out in order."""

    def __init__(self) -> None:
        self._events: list[Event] = []
        self._phases: list[str] = []
        self._next_key = 1
        self.last_event = 0  # the last event named (EVENT)

    def alloc(self, size: int, kind: str = "other", stream: int = 0) -> int:
        """Append an allocation of ``size`` bytes; returns its key (for :meth:`free`)."""
        key = self._next_key
        self._next_key += 1
        self._events.append((ALLOC, key, int(size), stream, KIND_INDEX[kind]))
        return key

    def alloc_run(self, sizes: list[int], kind: str = "other") -> range:
        """Append an allocation of each of ``sizes`` in order on the default stream (what :meth:`alloc` makes of
        each, in one pass); returns their keys."""
        first, code = self._next_key, KIND_INDEX[kind]
        keys = range(first, first + len(sizes))
        self._next_key = keys.stop
        self._events.extend([(ALLOC, key, int(size), 0, code) for key, size in zip(keys, sizes, strict=True)])
        return keys

    def free(self, key: int, event: int = 0) -> None:
        """Append the free of ``key``; with ``event``, in use on another stream until that event has run."""
        self._events.append((FREE, key, event, 0, 0))

    def event(self, event: int) -> None:
        """Append that the other stream's work up to ``event`` has run (see the module docstring)."""
        self.last_event = max(self.last_event, event)
        self._events.append((EVENT, event, 0, 0, 0))

    def empty_cache(self, mark: int = 0) -> None:
        """Append ``torch.cuda.empty_cache()``; ``mark`` (not 0): a place a policy may call it, for a builder
        that derives each policy's stream from one (:data:`search.streams.build.EVERY_PLACE`)."""
        self._events.append((EMPTY_CACHE, mark, 0, 0, 0))

    def phase(self, name: str) -> None:
        """Mark the start of phase ``name`` (a name seen before gets the same index)."""
        if name not in self._phases:
            self._phases.append(name)
        self._events.append((PHASE, self._phases.index(name), 0, 0, 0))

    def build(self) -> AllocStream:
        return AllocStream(tuple(self._events), tuple(self._phases))


# --- compact binary form (what a probe stores) --------------------------------------------------------

STREAM_FORMAT = "memplan-alloc-stream/1"  # the artifact format name of :func:`encode`'s bytes
_MAGIC = b"MPAS\x01"
_FIELDS = 5  # ints per event


def encode(stream: AllocStream) -> bytes:
    """The stream as compact bytes: a header, the phase names (JSON) and the events as little-endian int64s,
    zlib-compressed (a few bytes per event). :func:`decode` gives back an equal stream."""
    names = json.dumps(list(stream.phases), separators=(",", ":")).encode()
    packed = array("q", chain.from_iterable(stream.events))
    if sys.byteorder == "big":  # pragma: no cover - every supported platform is little-endian
        packed.byteswap()
    body = struct.pack("<QQ", len(names), len(stream.events)) + names + packed.tobytes()
    return _MAGIC + zlib.compress(body, 6)


def decode(data: bytes) -> AllocStream:
    """The stream :func:`encode` wrote; ValueError for bytes that are not one (wrong header, truncated)."""
    if not data.startswith(_MAGIC):
        raise ValueError("not an allocation stream (unknown header)")
    try:
        body = zlib.decompress(data[len(_MAGIC) :])
        name_bytes, count = struct.unpack_from("<QQ", body)
    except (zlib.error, struct.error) as exc:
        raise ValueError(f"allocation stream is corrupt: {exc}") from None
    start = struct.calcsize("<QQ")
    phases = json.loads(body[start : start + name_bytes])
    packed = array("q")
    packed.frombytes(body[start + name_bytes :])
    if len(packed) != count * _FIELDS or not isinstance(phases, list):
        raise ValueError(f"allocation stream is corrupt: {len(packed)} ints for {count} events")
    if sys.byteorder == "big":  # pragma: no cover
        packed.byteswap()
    values = iter(packed)
    events: tuple[Event, ...] = tuple(zip(values, values, values, values, values, strict=False))
    return AllocStream(events, tuple(str(name) for name in phases))
