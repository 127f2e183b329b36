"""A pure-Python port of the rules of torch's CUDA caching allocator, for replaying allocation streams.

:class:`CachingAllocator` follows ``DeviceCachingAllocator`` of ``c10/cuda/CUDACachingAllocator.cpp`` at
commit 001074d25084fdb87a799823e395a50f5ec044d3 (read through the public source index; torch 2.13.0 is
cf30153c4c13, whose installed headers agree on the settings, see :mod:`search.allocator.config`). The
device is a capacity of ``device_bytes`` (None: unlimited): a cudaMalloc fails when the bytes already held
plus the new segment exceed it. ``malloc`` takes, in the source's order: a cached best-fit block; else
(garbage collection when armed, then) a new segment; else release cached oversize blocks and retry; else
release every whole cached segment (``empty_cache``) and retry, a retry counted in ``num_alloc_retries``;
else an out-of-memory error, counted in ``num_ooms``. Addresses are simulated; a handle is an address.
"""

from __future__ import annotations

from bisect import bisect_left

from search.allocator.blocks import Block, BlockPool
from search.allocator.config import AllocatorConfig, allocation_size, round_size
from search.allocator.core import AllocParams
from search.allocator.expandable import ExpandableCore


class AllocatorOOM(MemoryError):
    """``torch.OutOfMemoryError``: the request could not be served even after releasing the cache."""

    def __init__(self, size: int, alloc_size: int, reserved: int, allocated: int, device_bytes: int | None) -> None:
        self.size, self.alloc_size, self.reserved, self.allocated = size, alloc_size, reserved, allocated
        self.device_bytes = device_bytes
        super().__init__(
            f"CUDA out of memory. Tried to allocate {alloc_size} bytes (a request of {size} bytes) on a device "
            f"of {device_bytes} bytes; {reserved} bytes reserved, {allocated} of them allocated"
        )


class CachingAllocator(ExpandableCore):
    """One device's caching allocator: ``malloc``/``free`` by handle, ``empty_cache``, ``reset_peak``.

    ``stats`` (an :class:`~search.allocator.blocks.AllocatorStats`) is live, updated by every call, as
    ``torch.cuda.memory_stats()`` would report it; ``stats.as_dict()`` takes a copy.
    """

    def __init__(self, config: AllocatorConfig = AllocatorConfig(), device_bytes: int | None = None) -> None:  # noqa: B008
        super().__init__(config, device_bytes)
        self._sizing: dict[int, tuple[int, int]] = {}  # request size -> (rounded size, segment size)

    def malloc(self, size: int, stream: int = 0) -> int:
        """Allocate ``size`` bytes on ``stream``; returns the block's handle (``DeviceCachingAllocator::malloc``).

        A request of 0 bytes returns the null handle 0 without touching the allocator, as ``allocate`` does.
        Raises :class:`AllocatorOOM` when even the retries after releasing the cache fail.
        """
        if size == 0:
            return 0
        sizing = self._sizing.get(size)
        if sizing is None:  # the rounding rules depend on the size alone: worked out once per size
            rounded = round_size(size, self.config)
            sizing = self._sizing[size] = (rounded, allocation_size(rounded, self.config))
        rounded, alloc_size = sizing
        p = AllocParams(rounded, stream, self.get_pool(rounded), alloc_size)
        found = self.get_free_block(p)
        if not found:
            if self.gc_armed:
                self.garbage_collect_cached_blocks()
            found = (
                self.alloc_block(p, is_retry=False)
                or (self.release_available_cached_blocks(p) and self.alloc_block(p, is_retry=False))
                or (self.release_cached_blocks() and self.alloc_block(p, is_retry=True))
            )
        if not found or p.block is None:
            self.stats.num_ooms += 1
            stats = self.stats
            raise AllocatorOOM(
                size, p.alloc_size, stats.reserved_bytes.current, stats.allocated_bytes.current, self.device_bytes
            )
        return self.alloc_found_block(p, size, self.should_split(p.block, rounded)).ptr

    def free(self, handle: int) -> None:
        """Free the block behind ``handle`` (``DeviceCachingAllocator::free``); the null handle is ignored."""
        if handle == 0:
            return
        block = self.allocated_blocks.pop(handle, None)
        if block is None:
            raise ValueError(f"invalid device pointer: {handle:#x}")
        block.allocated = False
        stats = self.stats
        stats.allocation.decrease(1)
        stats.allocated_bytes.decrease(block.size)
        if block.size >= self.max_split:
            stats.oversize_allocations.decrease(1)
        self.free_block(block)

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache()`` (``emptyCache`` -> ``release_cached_blocks``)."""
        self.release_cached_blocks()

    def reset_peak(self) -> None:
        """``torch.cuda.reset_peak_memory_stats()`` (``resetPeakStats``)."""
        self.stats.reset_peak()

    def alloc_block(self, p: AllocParams, is_retry: bool) -> bool:
        """Get a new segment for ``p`` (``alloc_block``): a cudaMalloc of ``p.alloc_size`` bytes, or with
        expandable segments a growth of the stream's segment by the pages ``p.size`` needs.

        A retry is counted on entry, whether or not it succeeds. With a memory fraction set, a request that
        would take the held bytes past the allowed maximum fails before any cudaMalloc.
        """
        stats = self.stats
        size = p.alloc_size
        if is_retry:
            stats.num_alloc_retries += 1
        if self.set_fraction and self.total_allocated_memory + size > self.allowed_memory_maximum:
            return False
        if self.config.expandable_segments:
            p.block = self.try_allocate_expandable_block(p.stream, p.pool, p.size)
            return p.block is not None
        if self.device_bytes is not None and self.total_allocated_memory + size > self.device_bytes:
            return False  # cudaMalloc: cudaErrorMemoryAllocation
        self.total_allocated_memory += size
        p.block = Block(p.stream, size, p.pool, self.new_address_range(size))
        stats.segment.increase(1)
        stats.reserved_bytes.increase(size)
        if size >= self.max_split:
            stats.oversize_segments.increase(1)
        stats.num_device_alloc += 1
        return True

    def release_available_cached_blocks(self, p: AllocParams) -> bool:
        """Free cached oversize segments of the request's stream and pool (``release_available_cached_blocks``).

        Does nothing without ``max_split_size``. Frees the smallest cached block of at least
        max(request, max_split_size) if there is one, else oversize blocks from the largest down until
        their bytes reach that size (and fails if they never do, keeping what it freed freed).
        """
        if self.config.max_split_size is None:
            return False
        pool, stream = p.pool, p.stream
        target = max(p.size, self.max_split)
        i = pool.lower_bound(stream, target)
        if i < len(pool.keys) and pool.keys[i][0] == stream:
            self.release_oversize_block(pool, i)
            return True
        if i == 0:
            return False
        released = 0
        i -= 1  # the largest block of the stream, then down
        while released < target and pool.keys[i][1] >= self.max_split and pool.keys[i][0] == stream:
            below = pool.keys[i - 1] if i > 0 else None
            released += pool.keys[i][1]
            self.release_oversize_block(pool, i)
            if below is None:
                break
            i = bisect_left(pool.keys, below)  # an unmap may have cached blocks before it
        return released >= target

    def release_oversize_block(self, pool: BlockPool, index: int) -> None:
        """``release_block`` of the cached block at ``index``; for a block of an expandable segment (where
        the source would fail an assertion) its whole free pages are unmapped instead."""
        block = pool.at(index)
        if block.segment is None:
            self.release_block(block)
        else:
            self.unmap_block(block)

    def release_cached_blocks(self) -> bool:
        """Release every cached whole segment of both pools (``release_cached_blocks``); always True."""
        self.stats.num_sync_all_streams += 1  # synchronize_and_free_events
        self.release_blocks(self.large_blocks)
        self.release_blocks(self.small_blocks)
        return True

    def release_blocks(self, pool: BlockPool) -> None:
        """cudaFree each cached unsplit segment; unmap the whole free pages of expandable segments, dropping
        a segment left with nothing mapped (``release_blocks``)."""
        to_unmap = []
        for block in [pool.at(i) for i in range(len(pool.keys))]:
            if block.segment is not None:
                to_unmap.append(block)
            elif block.prev is None and block.next is None:
                self.release_block(block)
        for block in to_unmap:
            self.unmap_block(block)
            if block.prev is None and block.next is None:
                self.release_expandable_segment(block)

    def garbage_collect_cached_blocks(self) -> None:
        """Free old cached segments once the held bytes pass ``garbage_collection_threshold`` of the allowed
        maximum (``garbage_collect_cached_blocks``).

        Only unsplit blocks of the large pool are candidates. Each round frees every candidate whose age
        (free-block searches of the pool since it was cached) is at least the candidates' mean age, and
        rounds go on until the bytes above the threshold are reclaimed or nothing was freed.
        """
        threshold = int(self.config.garbage_collection_threshold * self.allowed_memory_maximum)
        if self.total_allocated_memory <= threshold:
            return
        target = self.total_allocated_memory - threshold
        pool = self.large_blocks
        ages = [b.gc_count() for b in (pool.at(i) for i in range(len(pool.keys))) if not b.is_split()]
        total_age, count = sum(ages), len(ages)
        if count == 0:
            return
        reclaimed, freed = 0, True
        while reclaimed < target and freed and count > 0:
            age_threshold = total_age / count
            freed = False
            for block in [pool.at(i) for i in range(len(pool.keys))]:
                if not block.is_split() and block.gc_count() >= age_threshold:
                    freed = True
                    reclaimed += block.size
                    total_age -= block.gc_count()
                    count -= 1
                    self.release_block(block)
