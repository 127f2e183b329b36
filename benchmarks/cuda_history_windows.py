"""The replay side of ``benchmarks/cuda_history_gap.py``: the stream replayed through the allocator window by
window (which segments each phase makes, what blocks a free block from being reused, each cudaMalloc), and
the what-ifs it tries on the built stream (persistent tensors made late, hoisted, temporaries left out or
added).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from search.allocator import AllocatorConfig, AllocatorOOM, CachingAllocator
from store.alloc_stream import ALLOC, EMPTY_CACHE, FREE, KINDS, PHASE, AllocStream

MiB = 2**20
STEP = "step:"  # the step marker of search.streams.build (STEP_MARK), used for the recorded stream too
PHASES = ("forward", "backward", "optimizer_step")
BIG_SEGMENT = 256 * MiB  # cudaMallocs at least this large are listed one by one
WORKSPACE_MAX = 64 * MiB  # late never-freed allocations up to this size are taken for cuBLAS workspaces


@dataclass(frozen=True)
class Made:
    """Where an allocation of a replayed stream was made: its event index, step and phase, and its size."""

    event: int
    step: int
    phase: str
    size: int


@dataclass(frozen=True)
class Blocked:
    """A cached segment large enough for a request that made a new segment, and the live blocks splitting it."""

    segment: int
    free: int  # its largest free block
    blockers: tuple[Made, ...]


@dataclass(frozen=True)
class Malloc:
    """One new segment of a replay: the allocation that asked for it, and (large ones) the cached segments
    that would have served it had they not been split by live blocks."""

    made: Made
    segment: int
    stream: int
    blocked: tuple[Blocked, ...] = ()


@dataclass
class Window:
    """A phase run of a replay (``step`` 0 is the setup): its peaks and its new segments."""

    step: int
    phase: str
    peak_allocated: int = 0
    peak_reserved: int = 0
    end_reserved: int = 0
    mallocs: list[Malloc] = field(default_factory=list)


def _segments(allocator: CachingAllocator) -> dict[int, list[Any]]:
    """Every segment of a (non-expandable) replay: its first block's address -> its blocks in order."""
    blocks = list(allocator.allocated_blocks.values())
    blocks += list(allocator.large_blocks.by_ptr.values()) + list(allocator.small_blocks.by_ptr.values())
    heads = [b for b in blocks if b.prev is None]
    out: dict[int, list[Any]] = {}
    for head in heads:
        chain: list[Any] = []
        block: Any = head
        while block is not None:
            chain.append(block)
            block = block.next
        out[head.ptr] = chain
    return out


def _blocked(allocator: CachingAllocator, rounded: int, stream: int, new: int, made: dict[int, Made]) -> list[Blocked]:
    """The segments of ``stream`` (other than the new one at ``new``) that could hold ``rounded`` bytes whole,
    with the live blocks that split them."""
    found = []
    for ptr, chain in _segments(allocator).items():
        total = sum(b.size for b in chain)
        if ptr == new or total < rounded or chain[0].stream != stream:
            continue
        live = tuple(made[b.ptr] for b in chain if b.allocated and b.ptr in made)
        free = max((b.size for b in chain if not b.allocated), default=0)
        found.append(Blocked(total, free, live))
    return sorted(found, key=lambda b: b.segment)


def replay_windows(stream: AllocStream, config: AllocatorConfig = AllocatorConfig()) -> list[Window]:  # noqa: B008
    """Replay ``stream`` through :class:`search.allocator.CachingAllocator` as :func:`search.allocator.replay`
    does (peaks reset at each PHASE marker), noting each cudaMalloc with the request that made it and, for a
    segment of at least ``BIG_SEGMENT``, what blocked the cached segments that were large enough."""
    allocator = CachingAllocator(config)
    stats = allocator.stats
    handles: dict[int, int] = {}
    made: dict[int, Made] = {}  # live block address -> where it was made
    windows = [Window(0, "setup")]
    step = 0

    def close() -> None:
        w = windows[-1]
        w.peak_allocated, w.peak_reserved = stats.allocated_bytes.peak, stats.reserved_bytes.peak
        w.end_reserved = stats.reserved_bytes.current

    for index, (op, key, size, on_stream, _kind) in enumerate(stream.events):
        if op == ALLOC:
            before, held = stats.num_device_alloc, stats.reserved_bytes.current
            try:
                handle = handles[key] = allocator.malloc(size, on_stream)
            except AllocatorOOM:
                break
            here = made[handle] = Made(index, step, windows[-1].phase, size)
            if stats.num_device_alloc > before:
                grown = stats.reserved_bytes.current - held
                block = allocator.allocated_blocks[handle]
                head = block
                while head.prev is not None:
                    head = head.prev
                blocked = (
                    () if grown < BIG_SEGMENT else tuple(_blocked(allocator, block.size, on_stream, head.ptr, made))
                )
                windows[-1].mallocs.append(Malloc(here, grown, on_stream, blocked))
        elif op == FREE:
            freed = handles.pop(key, None)
            if freed is not None:
                made.pop(freed, None)
                allocator.free(freed)
        elif op == EMPTY_CACHE:
            allocator.empty_cache()
        elif op == PHASE:
            close()
            name = stream.phases[key]
            if name.startswith(STEP):
                step = int(name.removeprefix(STEP))
            windows.append(Window(step, name))
            allocator.reset_peak()
    close()
    return [w for w in windows if not w.phase.startswith(STEP) or w.mallocs]


def late_persistent(stream: AllocStream, largest: int = WORKSPACE_MAX) -> list[int]:
    """Event indices of the allocations made after the setup, never freed, of 1 MiB to ``largest`` bytes: the
    cuBLAS workspaces torch makes through the caching allocator at the first matrix product of each thread
    (the forward's, and autograd's backward thread's), not the optimizer states."""
    first_step = next(
        (i for i, (op, key, *_) in enumerate(stream.events) if op == PHASE and stream.phases[key].startswith(STEP)),
        len(stream.events),
    )
    freed = {key for op, key, *_ in stream.events if op == FREE}
    return [
        i
        for i, (op, key, size, _, _) in enumerate(stream.events)
        if i > first_step and op == ALLOC and key not in freed and MiB <= size <= largest
    ]


def hoisted(stream: AllocStream, events: Sequence[int]) -> AllocStream:
    """``stream`` with the allocations at ``events`` moved to its very start (made before anything else)."""
    moved = set(events)
    first = tuple(stream.events[i] for i in events)
    return AllocStream(first + tuple(e for i, e in enumerate(stream.events) if i not in moved), stream.phases)


def without_temporaries(
    stream: AllocStream, phases: Sequence[str] = PHASES[:2], largest: int = BIG_SEGMENT
) -> AllocStream:
    """``stream`` without the allocations below ``largest`` bytes freed in the phase (of ``phases``) that made
    them: the layers' own temporaries, not the loss's logits-sized tensors."""
    phase, made, dropped = "setup", {}, set()
    for op, key, size, _, _ in stream.events:
        if op == PHASE:
            name = stream.phases[key]
            phase = phase if name.startswith(STEP) else name
        elif op == ALLOC and size < largest:
            made[key] = phase
        elif op == FREE and made.get(key) == phase and phase in phases:
            dropped.add(key)
    kept = tuple(e for e in stream.events if not (e[0] in (ALLOC, FREE) and e[1] in dropped))
    return AllocStream(kept, stream.phases)


def built_with_forward_temporaries(built: AllocStream, sizes: Sequence[int]) -> AllocStream:
    """The built stream with, before each forward activation of one of ``sizes`` bytes, a temporary of the same
    size freed right after it (a layer's output made from a temporary that is then dropped: OPT's fc1 output
    before its ReLU, 128 MiB at 8 x 1024 tokens)."""
    events: list[Any] = []
    key = max((e[1] for e in built.events), default=0) + 1
    phase, activations = "setup", KINDS.index("activations")
    for event in built.events:
        op, _, size, _, kind = event
        if op == PHASE:
            name = built.phases[event[1]]
            phase = phase if name.startswith(STEP) else name
        if op == ALLOC and phase == PHASES[0] and kind == activations and size in sizes:
            events += [(ALLOC, key, size, 0, 0), event, (FREE, key, 0, 0, 0)]
            key += 1
        else:
            events.append(event)
    return AllocStream(tuple(events), built.phases)


def step_allocations(stream: AllocStream, step: int) -> dict[str, Counter[tuple[int, int, str]]]:
    """Per phase of step ``step``: how many allocations of each (size, stream, temp|kept), ``temp`` being
    freed before the phase ends."""
    phase, number = "setup", 0
    made: dict[int, tuple[str, int, int]] = {}
    out: dict[str, Counter[tuple[int, int, str]]] = defaultdict(Counter)
    freed_in_phase: set[int] = set()
    order: list[tuple[int, str]] = []
    for op, key, size, on_stream, _ in stream.events:
        if op == PHASE:
            name = stream.phases[key]
            if name.startswith(STEP):
                number = int(name.removeprefix(STEP))
            else:
                phase = name
        elif op == ALLOC and number == step and phase in PHASES:
            made[key] = (phase, size, on_stream)
            order.append((key, phase))
        elif op == FREE and key in made and made[key][0] == phase and number == step:
            freed_in_phase.add(key)
    for key, name in order:
        _, size, on_stream = made[key]
        out[name][(size, on_stream, "temp" if key in freed_in_phase else "kept")] += 1
    return out


def size_differences(
    recorded: Counter[tuple[int, int, str]], built: Counter[tuple[int, int, str]]
) -> list[tuple[int, int, str, int, int]]:
    """(size, stream, temp|kept, recorded count, built count) where the counts differ, most bytes first."""
    keys = set(recorded) | set(built)
    rows = [(size, s, how, recorded[(size, s, how)], built[(size, s, how)]) for size, s, how in keys]
    rows = [r for r in rows if r[3] != r[4]]
    return sorted(rows, key=lambda r: abs(r[3] - r[4]) * r[0], reverse=True)
