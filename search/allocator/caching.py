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

from bisect import bisect_left, insort
from typing import NamedTuple

from search.allocator.blocks import ADDRESS_LIMIT, FIELD_BITS, FIELD_MASK, STREAM_SHIFT, Block, BlockPool
from search.allocator.config import MIN_BLOCK_SIZE, SMALL_SIZE, AllocatorConfig, allocation_size, round_size
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


class Sizing(NamedTuple):
    """What the allocator's rules make of one request size (each depends on the size alone)."""

    rounded: int  # round_size
    alloc_size: int  # get_allocation_size: the segment a cudaMalloc gets for it
    pool: BlockPool  # get_pool
    probe: int  # the (size, null pointer) part of the packed key get_free_block searches from
    split_at: int  # should_split: the rest of a block split off when it is at least this
    too_large: int  # get_free_block: a cached block this large or larger is not taken for it


class CachingAllocator(ExpandableCore):
    """One device's caching allocator: ``malloc``/``free`` by handle, ``empty_cache``, ``reset_peak``.

    ``stats`` (an :class:`~search.allocator.blocks.AllocatorStats`) is live, updated by every call, as
    ``torch.cuda.memory_stats()`` would report it; ``stats.as_dict()`` takes a copy.
    """

    def __init__(self, config: AllocatorConfig = AllocatorConfig(), device_bytes: int | None = None) -> None:  # noqa: B008
        super().__init__(config, device_bytes)
        self._sizing: dict[int, Sizing] = {}  # request size -> its rules, worked out once per size

    def sizing(self, size: int) -> Sizing:
        """What the rules make of a request of ``size`` bytes, which depends on the size alone (:class:`Sizing`)."""
        rounded = round_size(size, self.config)
        pool = self.get_pool(rounded)
        max_split = self.max_split
        if pool.is_small or self.expandable:  # should_split: a rest of kMinBlockSize or more is split off
            split_at = MIN_BLOCK_SIZE
        else:  # large pool: a rest of more than kSmallSize, and only for a request below max_split_size
            split_at = SMALL_SIZE + 1 if rounded < max_split else ADDRESS_LIMIT  # no block reaches 2**64
        # get_free_block refuses an oversize block for a request below max_split_size, and for an oversize
        # request a block max_non_split_rounding_size or more larger than it
        too_large = max_split if rounded < max_split else rounded + self.max_non_split_rounding
        return Sizing(
            rounded,
            allocation_size(rounded, self.config),
            pool,
            min(rounded, FIELD_MASK) << FIELD_BITS,
            split_at,
            too_large,
        )

    def malloc(self, size: int, stream: int = 0) -> int:
        """Allocate ``size`` bytes on ``stream``; returns the block's handle (``DeviceCachingAllocator::malloc``).

        A request of 0 bytes returns the null handle 0 without touching the allocator, as ``allocate`` does.
        Raises :class:`AllocatorOOM` when even the retries after releasing the cache fail.

        The cached-block path runs once per event of a replayed stream, so ``get_free_block``,
        ``should_split`` and ``alloc_found_block`` are written out here on local names (each part marked),
        with the size rules worked out once per size (:meth:`sizing`) and the
        :class:`~search.allocator.blocks.Stat` counters updated in place (``increase_stat``'s arithmetic).
        """
        if size == 0:
            return 0
        waiting = self.outstanding  # record_stream's waiting blocks: empty unless the stream names events
        if waiting and self.events_ready:  # process_events: those whose events have completed go back first
            self.process_events()
        sizing = self._sizing.get(size)
        if sizing is None:
            sizing = self._sizing[size] = self.sizing(size)
        rounded, alloc_size, pool, probe, split_at, too_large = sizing
        # get_free_block: the first cached block at or after (stream, size, null pointer) in the sort order,
        # counted as a search for garbage collection when collection is armed
        if self.gc_armed:
            pool.get_free_blocks_call_count += 1
        order, by_ptr = pool.order, pool.by_ptr
        i = bisect_left(order, (stream << STREAM_SHIFT) + probe)
        block = None
        if i < len(order) and order[i] >> STREAM_SHIFT == stream:
            block = by_ptr[order[i] & FIELD_MASK]
            if block.segment is not None:
                block, i = _least_grown(order, by_ptr, i, stream, block)
            if block.size >= too_large:
                block = None
            else:  # blocks.erase(block): its key is order[i]
                del order[i]
                del by_ptr[block.ptr]
        if block is None:
            block = self.new_block(AllocParams(rounded, stream, pool, alloc_size), size)
        # alloc_found_block: split off the rest as a cached free block when should_split says so;
        # inactive_split_bytes (never for expandable segments): a new split adds the rest, shrinking an already
        # split free block takes the request away, reusing a whole split block takes it all
        stats = self.stats
        rest = block.size - rounded
        if rest >= split_at:
            block = self._split_off(block, rounded, rest, stream, pool)
        elif block.segment is None and (block.prev is not None or block.next is not None):  # already split
            stats.inactive_split_bytes.current -= block.size
            stats.inactive_split.current -= 1
        block.allocated = True
        block.requested_size = size
        ptr = block.ptr
        self.allocated_blocks[ptr] = block
        held = block.size
        stat = stats.allocation  # also stats.active (one counter, see AllocatorStats)
        stat.current += 1
        if stat.current > stat.peak:
            stat.peak = stat.current
        stat = stats.allocated_bytes  # also stats.active_bytes
        stat.current += held
        if stat.current > stat.peak:
            stat.peak = stat.current
        stat = stats.requested_bytes
        stat.current += size
        if stat.current > stat.peak:
            stat.peak = stat.current
        if held >= self.max_split:
            stats.oversize_allocations.increase(1)
        if waiting:
            self.track_active()
        return ptr

    def _split_off(self, remaining: Block, rounded: int, rest: int, stream: int, pool: BlockPool) -> Block:
        """alloc_found_block's split: a new block of ``rounded`` bytes takes the front of ``remaining``, whose
        ``rest`` goes back to the pool as a cached free block; returns the new block."""
        stats = self.stats
        segment, before, ptr = remaining.segment, remaining.prev, remaining.ptr
        already_split = segment is None and (before is not None or remaining.next is not None)
        block = Block(stream, rounded, pool, ptr, segment, before, remaining)
        if before is not None:
            before.next = block
        remaining.prev = block
        ptr += rounded
        remaining.ptr = ptr
        remaining.size = rest
        # pool.insert_into_blocks(remaining)
        remaining.gc_count_base = pool.get_free_blocks_call_count
        insort(pool.order, (stream << STREAM_SHIFT) + (rest << FIELD_BITS) + ptr)
        pool.by_ptr[ptr] = remaining
        if segment is None:
            stat = stats.inactive_split_bytes
            if already_split:
                stat.current -= rounded
            else:
                stat.current += rest
                if stat.current > stat.peak:
                    stat.peak = stat.current
                stat = stats.inactive_split
                stat.current += 1
                if stat.current > stat.peak:
                    stat.peak = stat.current
        return block

    def new_block(self, p: AllocParams, size: int) -> Block:
        """The block for a request no cached block serves (``malloc`` after ``get_free_block`` failed): garbage
        collection when armed, then a new segment; else release cached oversize blocks and retry; else release
        the whole cache and retry; else raise :class:`AllocatorOOM` (``size``: the request as asked)."""
        if self.gc_armed:
            self.garbage_collect_cached_blocks()
        found = (
            self.alloc_block(p, is_retry=False)
            or (self.release_available_cached_blocks(p) and self.alloc_block(p, is_retry=False))
            or (self.release_cached_blocks() and self.alloc_block(p, is_retry=True))
        )
        if not found or p.block is None:
            stats = self.stats
            stats.num_ooms += 1
            raise AllocatorOOM(
                size, p.alloc_size, stats.reserved_bytes.current, stats.allocated_bytes.current, self.device_bytes
            )
        return p.block

    def free(self, handle: int, event: int = 0) -> None:
        """Free the block behind ``handle`` (``DeviceCachingAllocator::free``); the null handle is ignored.
        With ``event`` (a pending use on another stream) the block waits for it (:meth:`insert_events`); else
        ``free_block``, written out here (see :meth:`malloc`): the block goes back to its pool merged with the
        free neighbours of its segment (``try_merge_blocks``), ``inactive_split`` following the net change."""
        if handle == 0:
            return
        block = self.allocated_blocks.pop(handle, None)
        if block is None:
            raise ValueError(f"invalid device pointer: {handle:#x}")
        stats = self.stats
        held = block.size
        stats.allocation.current -= 1  # also stats.active
        stats.allocated_bytes.current -= held  # also stats.active_bytes
        if held >= self.max_split:
            stats.oversize_allocations.decrease(1)
        if event:  # record_stream'ed: insert_events, not free_block
            return self.insert_events(block, event)
        block.allocated = False
        stats.requested_bytes.current -= block.requested_size
        # free_block
        pool, mapped = block.pool, block.mapped
        merged_blocks = merged_bytes = 0
        before, after = block.prev, block.next
        if before is not None and not before.allocated and before.mapped == mapped:  # try_merge_blocks: [src dst]
            block.ptr = before.ptr
            block.prev = before.prev
            if before.prev is not None:
                before.prev.next = block
            block.size += before.size
            merged_blocks, merged_bytes = 1, before.size
            pool.erase(before) if mapped else pool.erase_unmapped(before)
        if after is not None and not after.allocated and after.mapped == mapped:  # try_merge_blocks: [dst src]
            block.next = after.next
            if after.next is not None:
                after.next.prev = block
            block.size += after.size
            merged_blocks += 1
            merged_bytes += after.size
            pool.erase(after) if mapped else pool.erase_unmapped(after)
        size, ptr = block.size, block.ptr
        block.gc_count_base = pool.get_free_blocks_call_count  # pool.insert_into_blocks(block)
        insort(pool.order, (block.stream << STREAM_SHIFT) + (size << FIELD_BITS) + ptr)
        pool.by_ptr[ptr] = block
        if block.segment is None:  # expandable segments stay out of inactive_split, as in the source
            if block.prev is not None or block.next is not None:
                net_blocks, net_bytes = 1 - merged_blocks, size - merged_bytes
            else:
                net_blocks, net_bytes = -merged_blocks, -merged_bytes
            if net_blocks:
                stat = stats.inactive_split
                stat.current += net_blocks
                if stat.current > stat.peak:
                    stat.peak = stat.current
            if net_bytes:
                stat = stats.inactive_split_bytes
                stat.current += net_bytes
                if stat.current > stat.peak:
                    stat.peak = stat.current

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
        if i < len(pool.order) and pool.stream_at(i) == stream:
            self.release_oversize_block(pool, i)
            return True
        if i == 0:
            return False
        released = 0
        i -= 1  # the largest block of the stream, then down
        while released < target and pool.size_at(i) >= self.max_split and pool.stream_at(i) == stream:
            below = pool.order[i - 1] if i > 0 else None
            released += pool.size_at(i)
            self.release_oversize_block(pool, i)
            if below is None:
                break
            i = bisect_left(pool.order, below)  # an unmap may have cached blocks before it
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
        self.synchronize_and_free_events()  # counted in num_sync_all_streams
        self.release_blocks(self.large_blocks)
        self.release_blocks(self.small_blocks)
        return True

    def release_blocks(self, pool: BlockPool) -> None:
        """cudaFree each cached unsplit segment; unmap the whole free pages of expandable segments, dropping
        a segment left with nothing mapped (``release_blocks``)."""
        to_unmap = []
        for block in [pool.at(i) for i in range(len(pool.order))]:
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
        ages = [b.gc_count() for b in (pool.at(i) for i in range(len(pool.order))) if not b.is_split()]
        total_age, count = sum(ages), len(ages)
        if count == 0:
            return
        reclaimed, freed = 0, True
        while reclaimed < target and freed and count > 0:
            age_threshold = total_age / count
            freed = False
            for block in [pool.at(i) for i in range(len(pool.order))]:
                if not block.is_split() and block.gc_count() >= age_threshold:
                    freed = True
                    reclaimed += block.size
                    total_age -= block.gc_count()
                    count -= 1
                    self.release_block(block)


def _least_grown(order: list[int], by_ptr: dict[int, Block], i: int, stream: int, block: Block) -> tuple[Block, int]:
    """get_free_block with expandable segments: from ``block`` (at ``order[i]``) on, the first block on ``stream``
    whose size grown into the unmapped range after it is not below the next one's (only expandable blocks exist
    when they are on); the block and its index in ``order``."""
    after = block.next
    grown = block.size + (after.size if after is not None and not after.mapped else 0)
    j, n = i + 1, len(order)
    while block.segment is not None and j < n and order[j] >> STREAM_SHIFT == stream:
        candidate = by_ptr[order[j] & FIELD_MASK]
        after = candidate.next
        candidate_grown = candidate.size + (after.size if after is not None and not after.mapped else 0)
        if candidate_grown >= grown:
            break
        block, grown, i = candidate, candidate_grown, j
        j += 1
    return block, i
