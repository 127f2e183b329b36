"""Expandable segments (``expandable_segments:True``): one growing address range per stream and pool.

Follows Note [Expandable Segments] and the functions named below of ``CUDACachingAllocator.cpp``
(001074d25084fdb87a799823e395a50f5ec044d3). A segment reserves address space for 9/8 of the device (a
2**50-byte stand-in when ``device_bytes`` is None) and maps physical pages on demand: 2 MiB pages for the
small pool, the large segment size (20 MiB) for the large one. Reserved memory is the mapped bytes; each
map call counts as a device allocation, each unmap as a device free. A map fails, mapping nothing, when
the device lacks the bytes for all its pages. Simplification: the pages' physical handles, peer access,
IPC sharing and the stream synchronisation before an unmap are not modelled (no effect on the sizes).
"""

from __future__ import annotations

from bisect import bisect_left

from search.allocator.blocks import Block, BlockPool, ExpandableSegment
from search.allocator.config import SMALL_BUFFER
from search.allocator.core import AllocatorCore

UNLIMITED_ADDRESS_SPACE = 1 << 50


class ExpandableCore(AllocatorCore):
    """The allocator's rules for expandable segments, on top of :class:`AllocatorCore`."""

    def find_expandable_block(self, stream: int, pool: BlockPool, size: int) -> Block:
        """The lowest-addressed run of free and unmapped blocks of ``stream`` with room for ``size`` bytes,
        or a new segment's whole unmapped range (``find_expandable_block``)."""

        keys, unmapped = pool.unmapped_keys, pool.unmapped
        b: Block | None
        for i in range(bisect_left(keys, (stream, 0)), len(keys)):  # unmapped.lower_bound(stream, null)
            key = keys[i]
            if key[0] != stream:
                break
            c = unmapped[key[1]]
            if c.prev is not None and not c.prev.allocated:
                c = c.prev  # a free block right before the gap can grow into it
            # is there room for size bytes in the free and unmapped blocks from c on?
            got, b = 0, c
            while got < size and b is not None and not b.allocated:
                got += b.size
                b = b.next
            if got >= size:
                return c
        page = SMALL_BUFFER if pool.is_small else self.config.large_segment_size
        memory = self.device_bytes
        pages = UNLIMITED_ADDRESS_SPACE // page if memory is None else -(-(memory + memory // 8) // page)
        segment = ExpandableSegment(stream, self.new_address_range(pages * page), page, pages)
        candidate = Block(stream, segment.size, pool, segment.ptr)
        candidate.mapped = False
        candidate.segment = segment
        pool.insert_unmapped(candidate)
        return candidate

    def map_block(self, to_map: Block, size: int) -> bool:
        """Map the pages under the first ``size`` bytes of an unmapped range and cache them as a free block
        merged with its free neighbours (``map_block``); False when the device is out of memory."""
        segment = to_map.segment
        assert segment is not None and not to_map.mapped and size <= to_map.size
        start, mapped = segment.map(to_map.ptr, size, self.device_free_bytes())
        if mapped == 0:
            return False
        pool = to_map.pool
        pool.erase_unmapped(to_map)
        to_map.mapped = True
        if mapped < to_map.size:
            remaining = Block(to_map.stream, to_map.size - mapped, pool, to_map.ptr + mapped)
            remaining.mapped = False
            remaining.segment = segment
            remaining.splice(to_map, to_map.next)
            pool.insert_unmapped(remaining)
            to_map.size = mapped
        self.try_merge_blocks(to_map, to_map.prev, pool)
        self.try_merge_blocks(to_map, to_map.next, pool)
        pool.insert_into_blocks(to_map)
        self.total_allocated_memory += mapped
        self.stats.reserved_bytes.increase(mapped)
        self.stats.num_device_alloc += 1
        return True

    def try_allocate_expandable_block(self, stream: int, pool: BlockPool, size: int) -> Block | None:
        """Grow an expandable segment until a free block of ``size`` bytes exists there and take it
        (``try_allocate_expandable_block``): map the unmapped candidate, then the unmapped ranges after it.
        Pages mapped before a failure stay mapped (as free blocks), as in the source."""
        candidate = self.find_expandable_block(stream, pool, size)
        if not candidate.mapped and not self.map_block(candidate, min(candidate.size, size)):
            return None
        while candidate.size < size:
            following = candidate.next
            assert following is not None
            if not self.map_block(following, min(size - candidate.size, following.size)):
                return None
            candidate = following
        pool.erase(candidate)
        return candidate

    def unmap_block(self, block: Block) -> None:
        """Unmap the whole pages inside a free block of an expandable segment (``unmap_block``).

        The partial pages before and after stay cached as free blocks; the unmapped range merges with
        unmapped neighbours.
        """
        segment = block.segment
        assert segment is not None
        start, unmapped = segment.unmap(block.ptr, block.size)
        if unmapped == 0:
            return
        pool = block.pool
        pool.erase(block)
        before = start - block.ptr
        if before > 0:
            before_free = Block(block.stream, before, pool, block.ptr)
            before_free.segment = segment
            before_free.splice(block.prev, block)
            pool.insert_into_blocks(before_free)
        after = block.size - before - unmapped
        if after > 0:
            after_free = Block(block.stream, after, pool, start + unmapped)
            after_free.segment = segment
            after_free.splice(block, block.next)
            pool.insert_into_blocks(after_free)
        block.ptr = start
        block.size = unmapped
        block.mapped = False
        self.try_merge_blocks(block, block.prev, pool)
        self.try_merge_blocks(block, block.next, pool)
        pool.insert_unmapped(block)
        self.total_allocated_memory -= unmapped
        self.stats.reserved_bytes.decrease(unmapped)
        self.stats.num_device_free += 1

    @staticmethod
    def release_expandable_segment(block: Block) -> None:
        """Drop a segment whose whole range is unmapped (``release_expandable_segment``)."""
        assert block.segment is not None and not block.mapped and block.size == block.segment.size
        block.pool.erase_unmapped(block)
