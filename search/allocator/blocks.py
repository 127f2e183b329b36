"""Blocks, block pools and statistics of the caching allocator (the data of ``CUDACachingAllocator.cpp``).

A :class:`Block` is a piece of a segment (one cudaMalloc, or one expandable segment's address range),
linked to its neighbours in that segment. A :class:`BlockPool` holds the free blocks of one size class
(small or large) sorted as ``BlockComparatorSize`` sorts them, by (stream, size, address), so that a
best-fit search is one bisection; the unmapped ranges of expandable segments are kept apart, sorted by
(stream, address) as ``BlockComparatorAddress`` does. Streams are ints ordered as ints (the source orders
``cudaStream_t`` pointers; only the order within one stream matters to its rules).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass, field, fields


class Block:
    """One block (``struct Block``): free or allocated, mapped or not, with its segment neighbours."""

    __slots__ = (
        "stream",
        "size",
        "requested_size",
        "pool",
        "ptr",
        "allocated",
        "mapped",
        "prev",
        "next",
        "gc_count_base",
        "segment",
    )

    def __init__(
        self,
        stream: int,
        size: int,
        pool: BlockPool,
        ptr: int,
        segment: ExpandableSegment | None = None,
        prev: Block | None = None,
        after: Block | None = None,
    ) -> None:
        self.stream = stream
        self.size = size
        self.requested_size = 0
        self.pool = pool
        self.ptr = ptr
        self.allocated = False
        self.mapped = True  # False only for the unmapped ranges of an expandable segment
        self.prev = prev
        self.next = after
        self.gc_count_base = 0
        self.segment = segment  # the expandable segment, None for a cudaMalloc

    def is_split(self) -> bool:
        """A block with a neighbour is part of a split segment (``Block::is_split``)."""
        return self.prev is not None or self.next is not None

    def gc_count(self) -> int:
        """Free-block searches of its pool since it was cached (``Block::gc_count``)."""
        return self.pool.get_free_blocks_call_count - self.gc_count_base

    def splice(self, before: Block | None, after: Block | None) -> None:
        """Link this block between ``before`` and ``after`` (``Block::splice``)."""
        if before is not None:
            before.next = self
        self.prev = before
        if after is not None:
            after.prev = self
        self.next = after

    def __repr__(self) -> str:
        state = "allocated" if self.allocated else ("free" if self.mapped else "unmapped")
        return f"Block(stream={self.stream}, size={self.size}, ptr={self.ptr:#x}, {state})"


class ExpandableSegment:
    """One expandable segment's address range and which of its pages are mapped (``struct ExpandableSegment``).

    The range holds ``max_pages`` pages of ``page`` bytes (2 MiB for the small pool, the large segment size,
    20 MiB, for the large one); ``map``/``unmap`` work in whole pages, as the source's do.
    """

    __slots__ = ("stream", "ptr", "page", "max_pages", "pages")

    def __init__(self, stream: int, ptr: int, page: int, max_pages: int) -> None:
        self.stream = stream
        self.ptr = ptr
        self.page = page
        self.max_pages = max_pages
        self.pages: set[int] = set()  # indices of mapped pages

    @property
    def size(self) -> int:
        """Bytes of address space (``ExpandableSegment::size``)."""
        return self.max_pages * self.page

    def map(self, ptr: int, size: int, free_bytes: int | None) -> tuple[int, int]:
        """Map the pages covering [ptr, ptr + size): returns (start, bytes), 0 bytes when the device has fewer
        than ``free_bytes`` left for them (``ExpandableSegment::map``: a failed cuMemCreate releases the pages
        this call made, so a call maps all its pages or none)."""
        begin = (ptr - self.ptr) // self.page
        end = -(-(ptr + size - self.ptr) // self.page)
        start = self.ptr + begin * self.page
        need = (end - begin) * self.page
        if need == 0 or (free_bytes is not None and need > free_bytes):
            return start, 0
        pages = range(begin, end)
        if not self.pages.isdisjoint(pages):
            index = min(self.pages.intersection(pages))
            raise AssertionError(f"page {index} of the segment at {self.ptr:#x} is already mapped")
        self.pages.update(pages)
        return start, need

    def unmap(self, ptr: int, size: int) -> tuple[int, int]:
        """Unmap the whole pages inside [ptr, ptr + size): returns (start, bytes) (``ExpandableSegment::unmap``)."""
        begin = -(-(ptr - self.ptr) // self.page)
        end = (ptr + size - self.ptr) // self.page
        if begin >= end:
            return ptr, 0
        pages = range(begin, end)
        if not self.pages.issuperset(pages):
            raise KeyError(min(set(pages) - self.pages))  # set.remove's error for the first unmapped page
        self.pages.difference_update(pages)
        return self.ptr + begin * self.page, (end - begin) * self.page


# A cached block's sort key (stream, size, address) packed into one int, compared as the tuple would be:
# stream * 2**128 + size * 2**64 + address, exact while sizes and addresses stay below 2**64: every address is
# below ADDRESS_LIMIT and above ADDRESS_BASE (2**32), so every block's size is below 2**64 - 2**32, and a
# request's size is clamped to 2**64 - 1 (above every block's) before it is compared.
FIELD_BITS = 64
FIELD_MASK = (1 << FIELD_BITS) - 1
STREAM_SHIFT = 2 * FIELD_BITS
ADDRESS_LIMIT = 1 << FIELD_BITS  # simulated addresses (and so block sizes) stay below it


def block_key(stream: int, size: int, ptr: int) -> int:
    """The packed sort key of a block of ``size`` bytes at ``ptr`` on ``stream`` (see :data:`FIELD_BITS`)."""
    return (stream << STREAM_SHIFT) + (size << FIELD_BITS) + ptr


class BlockPool:
    """The cached free blocks of one size class (``struct BlockPool``).

    ``order`` is the sorted list of the free mapped blocks' packed (stream, size, ptr) keys
    (:func:`block_key`; :attr:`keys` unpacks them) and ``by_ptr`` finds a block by its address;
    ``unmapped_keys``/``unmapped`` do the same for unmapped ranges by (stream, ptr).
    ``get_free_blocks_call_count`` ages the blocks for garbage collection.
    """

    __slots__ = ("is_small", "order", "by_ptr", "unmapped_keys", "unmapped", "get_free_blocks_call_count")

    def __init__(self, is_small: bool) -> None:
        self.is_small = is_small
        self.order: list[int] = []
        self.by_ptr: dict[int, Block] = {}
        self.unmapped_keys: list[tuple[int, int]] = []
        self.unmapped: dict[int, Block] = {}
        self.get_free_blocks_call_count = 0

    @property
    def keys(self) -> list[tuple[int, int, int]]:
        """The cached blocks' (stream, size, ptr) in the sort order (unpacked from :attr:`order`)."""
        return [(key >> STREAM_SHIFT, (key >> FIELD_BITS) & FIELD_MASK, key & FIELD_MASK) for key in self.order]

    def insert_into_blocks(self, block: Block) -> None:
        """Cache a free block, restarting its garbage-collection age (``BlockPool::insert_into_blocks``)."""
        block.gc_count_base = self.get_free_blocks_call_count
        insort(self.order, (block.stream << STREAM_SHIFT) + (block.size << FIELD_BITS) + block.ptr)
        self.by_ptr[block.ptr] = block

    def erase(self, block: Block) -> None:
        """Take a free block out of the cache (``blocks.erase``)."""
        order = self.order
        key = (block.stream << STREAM_SHIFT) + (block.size << FIELD_BITS) + block.ptr
        i = bisect_left(order, key)
        if i == len(order) or order[i] != key:
            raise AssertionError(f"{block!r} is not cached")
        del order[i]
        del self.by_ptr[block.ptr]

    def lower_bound(self, stream: int, size: int) -> int:
        """Index of the first cached block not below (stream, size, null pointer) in the sort order."""
        return bisect_left(self.order, (stream << STREAM_SHIFT) + (min(size, FIELD_MASK) << FIELD_BITS))

    def at(self, index: int) -> Block:
        """The cached block at ``index`` of the sort order."""
        return self.by_ptr[self.order[index] & FIELD_MASK]

    def stream_at(self, index: int) -> int:
        """The stream of the cached block at ``index``."""
        return self.order[index] >> STREAM_SHIFT

    def size_at(self, index: int) -> int:
        """The size of the cached block at ``index``."""
        return (self.order[index] >> FIELD_BITS) & FIELD_MASK

    def insert_unmapped(self, block: Block) -> None:
        insort(self.unmapped_keys, (block.stream, block.ptr))
        self.unmapped[block.ptr] = block

    def erase_unmapped(self, block: Block) -> None:
        key = (block.stream, block.ptr)
        i = bisect_left(self.unmapped_keys, key)
        if i == len(self.unmapped_keys) or self.unmapped_keys[i] != key:
            raise AssertionError(f"{block!r} is not an unmapped range")
        del self.unmapped_keys[i]
        del self.unmapped[block.ptr]


class Stat:
    """A current value and its peak since the last reset (``struct Stat``)."""

    __slots__ = ("current", "peak")

    def __init__(self) -> None:
        self.current = 0
        self.peak = 0

    def increase(self, amount: int) -> None:
        """``increase_stat``: raise the current value and the peak with it."""
        self.current += amount
        if self.current > self.peak:
            self.peak = self.current

    def decrease(self, amount: int) -> None:
        """``decrease_stat``."""
        self.current -= amount

    def reset_peak(self) -> None:
        """``reset_peak_stat``: the peak restarts from the current value."""
        self.peak = self.current

    def __repr__(self) -> str:
        return f"Stat(current={self.current}, peak={self.peak})"


# torch's active counters in as_dict: (the allocation counter, the waiting blocks', their sum while any wait)
_ACTIVE = {
    "active": ("allocation", "awaiting", "active_awaiting"),
    "active_bytes": ("allocated_bytes", "awaiting_bytes", "active_awaiting_bytes"),
}


@dataclass
class AllocatorStats:
    """What ``torch.cuda.memory_stats()`` reports (aggregate over both pools), kept live by the allocator.

    Byte stats: ``allocated_bytes`` (rounded sizes of allocated blocks), ``requested_bytes`` (sizes as asked),
    ``reserved_bytes`` (cudaMalloc'd segments and mapped expandable pages), ``active_bytes``,
    ``inactive_split_bytes`` (free blocks of split cudaMalloc segments; expandable segments are left out, as
    in the source). Counters: ``num_alloc_retries``, ``num_ooms``, ``num_device_alloc`` (cudaMalloc and
    map calls), ``num_device_free`` (cudaFree and unmap calls), ``num_sync_all_streams``.
    """

    allocation: Stat = field(default_factory=Stat)
    segment: Stat = field(default_factory=Stat)
    active: Stat = field(default_factory=Stat)
    inactive_split: Stat = field(default_factory=Stat)
    allocated_bytes: Stat = field(default_factory=Stat)
    reserved_bytes: Stat = field(default_factory=Stat)
    active_bytes: Stat = field(default_factory=Stat)
    inactive_split_bytes: Stat = field(default_factory=Stat)
    requested_bytes: Stat = field(default_factory=Stat)
    oversize_allocations: Stat = field(default_factory=Stat)
    oversize_segments: Stat = field(default_factory=Stat)
    num_alloc_retries: int = 0
    num_ooms: int = 0
    num_sync_all_streams: int = 0
    num_device_alloc: int = 0
    num_device_free: int = 0
    # blocks freed with a pending use on another stream, waiting for their events (insert_events), and torch's
    # active counters (allocated plus waiting) while any wait
    awaiting: Stat = field(default_factory=Stat)
    awaiting_bytes: Stat = field(default_factory=Stat)
    active_awaiting: Stat = field(default_factory=Stat)
    active_awaiting_bytes: Stat = field(default_factory=Stat)

    def __post_init__(self) -> None:
        # A block is active while it is allocated or waits for its events (free lowers allocated, free_block
        # active): the malloc/free path moves one counter for both, and the allocator keeps the waiting blocks'
        # share apart (active_awaiting*, updated only while some block waits); as_dict adds them up.
        self.active = self.allocation
        self.active_bytes = self.allocated_bytes

    def reset_peak(self) -> None:
        """``resetPeakStats``: every peak restarts from its current value."""
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Stat):
                value.reset_peak()

    def as_dict(self) -> dict[str, int]:
        """Flat ``memory_stats()``-style keys: ``"allocated_bytes.all.current"``, ``"num_alloc_retries"``, ..."""
        out: dict[str, int] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.startswith(("awaiting", "active_awaiting")):
                continue  # folded into active below (torch reports no such key)
            if f.name in _ACTIVE:  # allocated plus waiting, and the peak either reached
                held, waiting, both = (getattr(self, name) for name in _ACTIVE[f.name])
                value = Stat()
                value.current = held.current + waiting.current
                value.peak = max(held.peak, both.peak)
            if isinstance(value, Stat):
                name = f.name if f.name.startswith("oversize") else f"{f.name}.all"
                out[f"{name}.current"] = value.current
                out[f"{name}.peak"] = value.peak
            else:
                out[f.name] = value
        return out
