"""Expandable segments (Note [Expandable Segments] of ``c10/cuda/CUDACachingAllocator.cpp``, commit
001074d25084): each test names the rule and the function it pins."""

from __future__ import annotations

from search.allocator import AllocatorConfig, CachingAllocator

MB = 1 << 20
EXPANDABLE = AllocatorConfig(expandable_segments=True)


def test_large_pool_grows_in_20mib_pages() -> None:
    """alloc_block -> try_allocate_expandable_block: the stream's segment maps the 20 MiB pages a request
    needs (ceil of the rounded size, not get_allocation_size); map_block counts as a device allocation."""
    a = CachingAllocator(EXPANDABLE)
    a.malloc(5 * MB)
    assert a.stats.reserved_bytes.current == 20 * MB
    a.malloc(10 * MB)  # fits in the 15 MiB left of the page (get_free_block, split)
    assert a.stats.reserved_bytes.current == 20 * MB
    a.malloc(10 * MB)  # the free 5 MiB grows into one more page (find_expandable_block)
    s = a.stats
    assert (s.reserved_bytes.current, s.num_device_alloc, s.allocated_bytes.current) == (40 * MB, 2, 25 * MB)


def test_small_pool_grows_in_2mib_pages() -> None:
    """find_expandable_block: the small pool's segment uses 2 MiB pages (kSmallBuffer)."""
    a = CachingAllocator(EXPANDABLE)
    a.malloc(1024)
    a.malloc(30 * MB)  # the large pool has a segment of its own
    assert a.stats.reserved_bytes.current == 2 * MB + 40 * MB


def test_a_larger_request_after_a_free_maps_only_the_extra_pages() -> None:
    """find_expandable_block: a free block right before the unmapped range grows into it, so a request
    larger than what was freed maps only the pages it lacks (one map_block call)."""
    a = CachingAllocator(EXPANDABLE)
    a.free(a.malloc(30 * MB))  # two pages, 40 MiB, all free again
    a.malloc(50 * MB)
    s = a.stats
    assert (s.reserved_bytes.current, s.num_device_alloc) == (60 * MB, 2)


def test_splits_leave_512_bytes_and_stay_out_of_inactive_split() -> None:
    """should_split with expandable segments: any rest of 512 bytes or more is split off, in the large pool
    too; free_block / alloc_found_block leave expandable blocks out of inactive_split_bytes."""
    a = CachingAllocator(EXPANDABLE)
    a.malloc(20 * MB - 512)
    assert a.stats.allocated_bytes.current == 20 * MB - 512
    assert a.stats.inactive_split_bytes.current == 0


def test_empty_cache_unmaps_free_pages_and_drops_an_empty_segment() -> None:
    """release_blocks -> unmap_block: only whole free pages are unmapped (one device free per block); a
    segment left with nothing mapped is released (release_expandable_segment)."""
    a = CachingAllocator(EXPANDABLE)
    x = a.malloc(30 * MB)  # pages 0 and 1
    y = a.malloc(5 * MB)  # inside page 1
    a.free(x)
    a.empty_cache()  # page 0 is free: unmapped; the free 10 MiB of page 1 stays mapped
    assert (a.stats.reserved_bytes.current, a.stats.num_device_free) == (20 * MB, 1)
    a.free(y)
    a.empty_cache()
    assert (a.stats.reserved_bytes.current, a.stats.num_device_free) == (0, 2)
    a.malloc(5 * MB)  # a fresh segment is made and mapped again
    assert a.stats.reserved_bytes.current == 20 * MB


def test_unmapped_gap_is_filled_first() -> None:
    """find_expandable_block: the lowest-addressed gap with room is mapped again before the segment's end."""
    a = CachingAllocator(EXPANDABLE)
    x = a.malloc(40 * MB)  # pages 0-1
    a.malloc(20 * MB)  # page 2
    a.free(x)
    a.empty_cache()  # pages 0-1 unmapped: a gap before the live page 2
    assert a.stats.reserved_bytes.current == 20 * MB
    assert a.malloc(40 * MB) == x  # mapped back at the segment's start


def test_out_of_memory_unmaps_another_streams_pages_and_retries() -> None:
    """malloc: when map_block fails (the device is full), release_cached_blocks unmaps free pages of every
    stream's segment and alloc_block retries, counted in num_alloc_retries."""
    a = CachingAllocator(EXPANDABLE, device_bytes=60 * MB)
    a.free(a.malloc(40 * MB, stream=0))
    a.malloc(40 * MB, stream=1)  # 40 + 40 > 60: stream 0's pages are unmapped first
    s = a.stats
    assert (s.num_alloc_retries, s.num_ooms, s.reserved_bytes.current) == (1, 0, 40 * MB)
