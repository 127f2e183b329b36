"""The allocator's state and its block-level rules: best fit, split, merge, segment release.

Each method follows the function of ``DeviceCachingAllocator`` (``c10/cuda/CUDACachingAllocator.cpp`` at
001074d25084fdb87a799823e395a50f5ec044d3) named in its docstring. Not modelled, because an allocation
stream has none of them: CUDA graph private pools, ``record_stream`` (cross-stream uses and their events:
every free is completed at once), free-memory callbacks, and the per-pool (small/large) stat breakdown.
"""

from __future__ import annotations

from search.allocator.blocks import AllocatorStats, Block, BlockPool
from search.allocator.config import MIN_BLOCK_SIZE, SMALL_SIZE, AllocatorConfig

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

    def new_address_range(self, size: int) -> int:
        """A fresh simulated device address range of ``size`` bytes (what cudaMalloc would return)."""
        ptr = self._next_address
        self._next_address += size
        return ptr

    def device_free_bytes(self) -> int | None:
        """Bytes the device could still give (None: unlimited)."""
        return None if self.device_bytes is None else self.device_bytes - self.total_allocated_memory

    def get_pool(self, size: int) -> BlockPool:
        """Small pool for rounded sizes up to 1 MiB, else large (``get_pool``)."""
        return self.small_blocks if size <= SMALL_SIZE else self.large_blocks

    def get_free_block(self, p: AllocParams) -> bool:
        """Best fit among the cached blocks of the request's stream and pool (``get_free_block``).

        The first block at or after (stream, size) is taken unless: it belongs to another stream; the request
        is below ``max_split_size`` and the block is not (an oversize block is kept for oversize requests);
        the request is oversize and the block is ``max_non_split_rounding_size`` (20 MiB) or more larger.
        With expandable segments, a block that could grow into the unmapped range after it is ranked by that
        grown size. Counts a search for garbage collection only when collection is armed.
        """
        pool = p.pool
        if self.gc_armed:
            pool.get_free_blocks_call_count += 1
        keys = pool.keys
        i = pool.lower_bound(p.stream, p.size)
        if i == len(keys) or keys[i][0] != p.stream:
            return False
        block = pool.at(i)
        if block.segment is not None:
            # rank the expandable block by the size it can grow to (only expandable blocks exist when on)
            def expandable_size(b: Block) -> int:
                nxt = b.next
                return b.size + (nxt.size if nxt is not None and not nxt.mapped else 0)

            j = i + 1
            while block.segment is not None and j < len(keys) and keys[j][0] == p.stream:
                candidate = pool.at(j)
                if expandable_size(candidate) >= expandable_size(block):
                    break
                block, j = candidate, j + 1
        if p.size < self.max_split <= block.size:
            return False
        if p.size >= self.max_split and block.size >= p.size + self.config.max_non_split_rounding_size:
            return False
        pool.erase(block)
        p.block = block
        return True

    def should_split(self, block: Block, size: int) -> bool:
        """Whether the rest of ``block`` after ``size`` bytes becomes a free block of its own (``should_split``).

        Small pool, or expandable segments on: when 512 bytes or more remain. Large pool: when the request is
        below ``max_split_size`` and more than 1 MiB remains.
        """
        remaining = block.size - size
        if block.pool.is_small or self.config.expandable_segments:
            return remaining >= MIN_BLOCK_SIZE
        return size < self.max_split and remaining > SMALL_SIZE

    def alloc_found_block(self, p: AllocParams, orig_size: int, split_remainder: bool) -> Block:
        """Hand out ``p.block``, first splitting off its remainder as a cached free block (``alloc_found_block``).

        ``inactive_split_bytes`` follows the source: a new split adds the remainder, shrinking an already
        split free block takes the request away, reusing a whole split block takes it all; never for blocks
        of expandable segments.
        """
        block = p.block
        assert block is not None
        size, pool, stats = p.size, p.pool, self.stats
        already_split = block.is_split()
        if split_remainder:
            remaining = block
            block = Block(p.stream, size, pool, remaining.ptr)
            block.segment = remaining.segment
            block.prev = remaining.prev
            if block.prev is not None:
                block.prev.next = block
            block.next = remaining
            remaining.prev = block
            remaining.ptr += size
            remaining.size -= size
            pool.insert_into_blocks(remaining)
            if block.segment is None:
                if already_split:
                    stats.inactive_split_bytes.decrease(size)
                else:
                    stats.inactive_split_bytes.increase(remaining.size)
                    stats.inactive_split.increase(1)
        elif already_split and block.segment is None:
            stats.inactive_split_bytes.decrease(block.size)
            stats.inactive_split.decrease(1)
        block.allocated = True
        block.requested_size = orig_size
        self.allocated_blocks[block.ptr] = block
        stats.allocation.increase(1)
        stats.allocated_bytes.increase(block.size)
        stats.active.increase(1)
        stats.active_bytes.increase(block.size)
        stats.requested_bytes.increase(orig_size)
        if block.size >= self.max_split:
            stats.oversize_allocations.increase(1)
        return block

    def free_block(self, block: Block) -> None:
        """Return a block to its pool, merged with free neighbours of its segment (``free_block``)."""
        pool, stats = block.pool, self.stats
        original_size, requested = block.size, block.requested_size
        net_blocks = net_bytes = 0
        for candidate in (block.prev, block.next):
            subsumed = self.try_merge_blocks(block, candidate, pool)
            if subsumed:
                net_blocks -= 1
                net_bytes -= subsumed
        pool.insert_into_blocks(block)
        if block.is_split():
            net_blocks += 1
            net_bytes += block.size
        if block.segment is None:  # expandable segments stay out of inactive_split, as in the source
            if net_blocks > 0:
                stats.inactive_split.increase(net_blocks)
            elif net_blocks < 0:
                stats.inactive_split.decrease(-net_blocks)
            if net_bytes > 0:
                stats.inactive_split_bytes.increase(net_bytes)
            elif net_bytes < 0:
                stats.inactive_split_bytes.decrease(-net_bytes)
        stats.active.decrease(1)
        stats.active_bytes.decrease(original_size)
        stats.requested_bytes.decrease(requested)

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
