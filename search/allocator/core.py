"""The allocator's state and its block-level rules shared by its paths: merge, segment release.

Each method follows the function of ``DeviceCachingAllocator`` (``c10/cuda/CUDACachingAllocator.cpp`` at
001074d25084fdb87a799823e395a50f5ec044d3) named in its docstring. Not modelled, because an allocation
stream has none of them: CUDA graph private pools, ``record_stream`` (cross-stream uses and their events:
every free is completed at once), free-memory callbacks, and the per-pool (small/large) stat breakdown.
"""

from __future__ import annotations

from collections import deque

from search.allocator.blocks import ADDRESS_LIMIT, AllocatorStats, Block, BlockPool
from search.allocator.config import SMALL_SIZE, AllocatorConfig

ADDRESS_BASE = 1 << 32  # simulated device addresses start here; each segment gets a fresh range


class AllocParams:
    """One request on its way through ``malloc`` (``struct AllocParams``)."""

    __slots__ = ("size", "stream", "pool", "alloc_size", "block")

    def __init__(self, size: int, stream: int, pool: BlockPool, alloc_size: int) -> None:
        self.size = size  # rounded request
        self.stream = stream
        self.pool = pool
        self.alloc_size = alloc_size  # segment size a cudaMalloc would get
        self.block: Block | None = None


class AllocatorCore:
    """State of one device's caching allocator and the rules on blocks (``DeviceCachingAllocator``)."""

    def __init__(self, config: AllocatorConfig, device_bytes: int | None) -> None:
        fraction = config.per_process_memory_fraction
        if fraction is not None and device_bytes is None:
            raise ValueError("per_process_memory_fraction needs device_bytes (the fraction is of the device)")
        self.config = config
        self.device_bytes = device_bytes
        self.max_split = config.split_limit
        self.max_non_split_rounding = config.max_non_split_rounding_size
        self.expandable = config.expandable_segments
        self.small_blocks = BlockPool(is_small=True)
        self.large_blocks = BlockPool(is_small=False)
        self.stats = AllocatorStats()
        self.total_allocated_memory = 0  # bytes held from the device (segments and mapped pages)
        # set_per_process_memory_fraction: caps total_allocated_memory and arms garbage collection
        self.set_fraction = fraction is not None
        self.allowed_memory_maximum = int(fraction * device_bytes) if fraction is not None and device_bytes else 0
        self.gc_armed = self.set_fraction and config.garbage_collection_threshold > 0.0
        self.allocated_blocks: dict[int, Block] = {}  # handle (address) -> allocated block
        self._next_address = ADDRESS_BASE
        # insert_events' queue: (event, block) in the order the blocks were freed; events up to
        # completed_upto have run; events_ready: the queue's front may have run (process_events has work)
        self.outstanding: deque[tuple[int, Block]] = deque()
        self.completed_upto = 0
        self.events_ready = False

    def new_address_range(self, size: int) -> int:
        """A fresh simulated device address range of ``size`` bytes (what cudaMalloc would return).

        Raises AssertionError past :data:`~search.allocator.blocks.ADDRESS_LIMIT` (2**64), where the packed
        sort keys of the pools would stop ordering as the source's (stream, size, address) tuples do."""
        ptr = self._next_address
        if ptr + size > ADDRESS_LIMIT:
            raise AssertionError(f"the simulated address space (2**64 bytes) cannot hold {size} more bytes")
        self._next_address += size
        return ptr

    def device_free_bytes(self) -> int | None:
        """Bytes the device could still give (None: unlimited)."""
        return None if self.device_bytes is None else self.device_bytes - self.total_allocated_memory

    def get_pool(self, size: int) -> BlockPool:
        """Small pool for rounded sizes up to 1 MiB, else large (``get_pool``)."""
        return self.small_blocks if size <= SMALL_SIZE else self.large_blocks

    @staticmethod
    def try_merge_blocks(dst: Block, src: Block | None, pool: BlockPool) -> int:
        """Fold the free neighbour ``src`` into ``dst``; returns the bytes taken, 0 when it cannot
        (``try_merge_blocks``: ``src`` must be free and mapped exactly as ``dst`` is)."""
        if src is None or src.allocated or src.mapped != dst.mapped:
            return 0
        if dst.prev is src:  # [src dst]
            dst.ptr = src.ptr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:  # [dst src]
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        if src.mapped:
            pool.erase(src)
        else:
            pool.erase_unmapped(src)
        return src.size

    def release_block(self, block: Block) -> None:
        """cudaFree a cached whole segment (``release_block``)."""
        if block.segment is not None:
            raise AssertionError("release_block on a block of an expandable segment")
        stats = self.stats
        stats.num_device_free += 1
        self.total_allocated_memory -= block.size
        stats.segment.decrease(1)
        stats.reserved_bytes.decrease(block.size)
        if block.size >= self.max_split:
            stats.oversize_segments.decrease(1)
        block.pool.erase(block)

    def insert_events(self, block: Block, event: int) -> None:
        """``free`` of a block with a pending use on another stream (``insert_events``): it waits for ``event``
        instead of going back to its pool; ``allocated`` already fell, ``active`` and ``requested`` stay."""
        if event <= 0:
            raise ValueError(f"an event is a positive int, got {event}")
        self.outstanding.append((event, block))
        self.events_ready = self.events_ready or event <= self.completed_upto
        stats = self.stats
        stats.awaiting.increase(1)
        stats.awaiting_bytes.increase(block.size)
        self.track_active()

    def complete(self, event: int) -> None:
        """The stream's work up to ``event`` has run: its blocks and those of every smaller event may return
        (at the next ``malloc``'s ``process_events``, as a ``cudaEventQuery`` would then find them done)."""
        if event > self.completed_upto:
            self.completed_upto = event
            self.events_ready = bool(self.outstanding)

    def synchronize(self) -> None:
        """A stream or device synchronize: every event recorded so far has completed."""
        if self.outstanding:
            self.complete(max(event for event, _ in self.outstanding))

    def process_events(self) -> None:
        """Return to their pools the waiting blocks whose events have completed, in the order they were freed,
        stopping at the first event not completed (``process_events``)."""
        outstanding, done = self.outstanding, self.completed_upto
        while outstanding and outstanding[0][0] <= done:
            self.free_block(outstanding.popleft()[1])
        self.events_ready = False

    def synchronize_and_free_events(self) -> None:
        """Wait for every outstanding event and return its block (``synchronize_and_free_events``, counted in
        ``num_sync_all_streams``)."""
        self.stats.num_sync_all_streams += 1
        self.synchronize()
        self.process_events()

    def track_active(self) -> None:
        """While blocks wait for events torch's ``active`` counters (allocated plus waiting) part from the
        allocation ones: keep their current value and peak (:attr:`AllocatorStats.active_awaiting`)."""
        stats = self.stats
        stats.active_awaiting.current = stats.allocation.current + stats.awaiting.current
        stats.active_awaiting_bytes.current = stats.allocated_bytes.current + stats.awaiting_bytes.current
        for stat in (stats.active_awaiting, stats.active_awaiting_bytes):
            if stat.current > stat.peak:
                stat.peak = stat.current

    def free_block(self, block: Block) -> None:
        """A waiting block back to its pool, merged with its free neighbours (``free_block``), ``inactive_split``
        following the net change; ``active`` and ``requested`` fall now. (``free`` writes the same out for the
        blocks that never wait.)"""
        block.allocated = False
        stats = self.stats
        stats.awaiting.decrease(1)
        stats.awaiting_bytes.decrease(block.size)
        stats.requested_bytes.decrease(block.requested_size)
        pool = block.pool
        neighbours = (block.prev, block.next)
        merged_blocks = merged_bytes = 0
        for neighbour in neighbours:
            taken = self.try_merge_blocks(block, neighbour, pool)
            merged_blocks += 1 if taken else 0
            merged_bytes += taken
        pool.insert_into_blocks(block)
        if block.segment is None:
            if block.is_split():
                net_blocks, net_bytes = 1 - merged_blocks, block.size - merged_bytes
            else:
                net_blocks, net_bytes = -merged_blocks, -merged_bytes
            for stat, change in ((stats.inactive_split, net_blocks), (stats.inactive_split_bytes, net_bytes)):
                stat.increase(change)  # a fall leaves the peak where it was, as decrease_stat does
        self.track_active()
