"""The allocator's bookkeeping after every call of a long random sequence, under each setting: the stats
torch reports must equal what the blocks themselves add up to (``CUDACachingAllocator.cpp``'s invariants:
segments tile their range, free neighbours are always merged by free_block/try_merge_blocks, pools hold
exactly the free blocks, ``reserved_bytes`` is the held segments and mapped pages)."""

from __future__ import annotations

import contextlib
import random

import pytest

from search.allocator import AllocatorConfig, AllocatorOOM, CachingAllocator
from search.allocator.blocks import Block

MB = 1 << 20


def _chains(a: CachingAllocator) -> list[list[Block]]:
    blocks: list[Block] = list(a.allocated_blocks.values())
    for pool in (a.small_blocks, a.large_blocks):
        blocks += list(pool.by_ptr.values()) + list(pool.unmapped.values())
    chains = []
    for head in blocks:
        if head.prev is None:
            chain, b = [], head
            while b is not None:
                chain.append(b)
                b = b.next
            chains.append(chain)
    assert sum(len(c) for c in chains) == len(blocks)
    return chains


def _check(a: CachingAllocator) -> None:
    s = a.stats
    reserved = inactive = 0
    cached_keys = {id(pool): set(pool.keys) for pool in (a.small_blocks, a.large_blocks)}  # unpacked once a check
    for chain in _chains(a):
        for left, right in zip(chain, chain[1:], strict=False):
            assert left.ptr + left.size == right.ptr and left.stream == right.stream
            assert left.allocated or right.allocated or left.mapped != right.mapped  # merged when both free
        for b in chain:
            pool = b.pool
            if b.allocated:
                assert a.allocated_blocks[b.ptr] is b
            elif b.mapped:
                assert pool.by_ptr[b.ptr] is b and (b.stream, b.size, b.ptr) in cached_keys[id(pool)]
            else:
                assert pool.unmapped[b.ptr] is b and b.segment is not None
        segment = chain[0].segment
        if segment is None:
            reserved += sum(b.size for b in chain)
            if len(chain) > 1:
                inactive += sum(b.size for b in chain if not b.allocated)
        else:
            mapped = sum(b.size for b in chain if b.mapped)
            assert mapped == len(segment.pages) * segment.page
            assert sum(b.size for b in chain) == segment.size
            reserved += mapped
    assert reserved == s.reserved_bytes.current == a.total_allocated_memory
    assert inactive == s.inactive_split_bytes.current
    live = list(a.allocated_blocks.values())
    assert s.allocated_bytes.current == sum(b.size for b in live)
    assert s.requested_bytes.current == sum(b.requested_size for b in live)
    assert s.allocation.current == len(live)
    for pool in (a.small_blocks, a.large_blocks):
        keys = pool.keys
        assert keys == sorted(keys) and len(keys) == len(pool.by_ptr)


CONFIGS = [
    AllocatorConfig(),
    AllocatorConfig(max_split_size=40 * MB),
    AllocatorConfig(roundup_power2_divisions=(4,) * 16),
    AllocatorConfig(garbage_collection_threshold=0.6, per_process_memory_fraction=0.9),
    AllocatorConfig(expandable_segments=True),
    AllocatorConfig(expandable_segments=True, max_split_size=40 * MB),
]


@pytest.mark.parametrize("config", CONFIGS, ids=range(len(CONFIGS)))
@pytest.mark.parametrize("device_bytes", [None, 1024 * MB])
def test_bookkeeping_holds_after_every_call(config: AllocatorConfig, device_bytes: int | None) -> None:
    """Every rule (best fit, split, merge, release, retry, collection, map/unmap) keeps the stats exact."""
    rng = random.Random(11)
    a = CachingAllocator(config, device_bytes or (4 << 40))
    live: list[int] = []
    for _ in range(1500):
        roll = rng.random()
        if roll < 0.55 or not live:
            size = rng.choice([rng.randrange(1, 4096), rng.randrange(1, 2 * MB), rng.randrange(MB, 120 * MB)])
            with contextlib.suppress(AllocatorOOM):
                live.append(a.malloc(size, stream=rng.choice([0, 0, 1])))
        elif roll < 0.985:
            a.free(live.pop(rng.randrange(len(live))))
        else:
            a.empty_cache()
        _check(a)
    for handle in live:
        a.free(handle)
    a.empty_cache()
    _check(a)
    assert a.stats.reserved_bytes.current == 0
    if device_bytes:
        assert a.stats.num_alloc_retries > 0  # the device filled up: the retry path ran
