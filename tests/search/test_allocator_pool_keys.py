"""The free-block pools keep their (stream, size, address) order as packed ints (search.allocator.blocks): over
random inserts and erases, with streams below zero and sizes and addresses up to the 2**64 bound, the packed
order and every best-fit search must be exactly what a plain sorted list of the tuples gives."""

from __future__ import annotations

import random
from bisect import bisect_left

import pytest

from search.allocator import AllocatorConfig, CachingAllocator
from search.allocator.blocks import Block, BlockPool

ADDRESS_LIMIT = 1 << 64  # device pointers are 64-bit: the pools must order any of them as tuples would


def _edge_int(rng: random.Random, top: int) -> int:
    """Small values, values near powers of two and values near ``top`` (where a packing would overflow)."""
    kind = rng.random()
    if kind < 0.3:
        return rng.randrange(0, 4096)
    if kind < 0.6:
        return min(top - 1, max(0, (1 << rng.randrange(1, top.bit_length())) + rng.randrange(-3, 4)))
    return top - 1 - rng.randrange(0, 4096)


def test_packed_order_and_lower_bound_match_sorted_tuples() -> None:
    """Seeded: 3,000 random operations; after each, the pool's order unpacks to the sorted tuples, and
    lower_bound (requests past 2**64 included) lands where bisect on the tuples does."""
    rng = random.Random(47)
    pool = BlockPool(is_small=False)
    reference: list[tuple[int, int, int]] = []
    cached: dict[int, Block] = {}
    for _ in range(3000):
        if cached and rng.random() < 0.45:
            block = cached.pop(rng.choice(list(cached)))
            pool.erase(block)
            reference.remove((block.stream, block.size, block.ptr))
        else:
            ptr = _edge_int(rng, ADDRESS_LIMIT)
            if ptr in cached:
                continue
            # a block's size is below 2**64 - 1: it lies in the address space above ADDRESS_BASE
            block = Block(rng.choice([-2, -1, 0, 0, 1, 7]), _edge_int(rng, ADDRESS_LIMIT - 1), pool, ptr)
            pool.insert_into_blocks(block)
            cached[ptr] = block
            reference.append((block.stream, block.size, block.ptr))
        reference.sort()
        assert pool.keys == reference
        stream, size = rng.choice([-2, -1, 0, 1, 7]), _edge_int(rng, ADDRESS_LIMIT << rng.randrange(0, 2))
        i = pool.lower_bound(stream, size)
        assert i == bisect_left(reference, (stream, size, 0))
        if i < len(reference):
            assert (pool.stream_at(i), pool.size_at(i), pool.at(i).ptr) == reference[i]


def test_the_simulated_address_space_ends_at_the_packing_bound() -> None:
    """Addresses past 2**64 would break the packed order: the allocator refuses them instead of misordering."""
    a = CachingAllocator(AllocatorConfig())
    a.malloc(ADDRESS_LIMIT // 4)
    with pytest.raises(AssertionError, match="address space"):
        a.malloc(ADDRESS_LIMIT // 2 + ADDRESS_LIMIT // 4)
