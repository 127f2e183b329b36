"""The caching allocator's rules, each pinned by a small hand-built sequence whose outcome follows from
``c10/cuda/CUDACachingAllocator.cpp`` (commit 001074d25084); each test names the rule and the function."""

from __future__ import annotations

import pytest

from search.allocator import AllocatorConfig, AllocatorOOM, CachingAllocator, allocation_size, round_size

MB = 1 << 20


def test_one_byte_is_512_allocated_in_a_2mib_small_segment() -> None:
    """round_size: below 512 bytes -> 512; get_allocation_size: the small pool's segment is 2 MiB."""
    a = CachingAllocator()
    a.malloc(1)
    assert a.stats.requested_bytes.current == 1
    assert a.stats.allocated_bytes.current == 512
    assert a.stats.reserved_bytes.current == 2 * MB
    assert a.stats.num_device_alloc == 1


def test_sizes_round_up_to_multiples_of_512() -> None:
    """round_size: without roundup_power2_divisions a size is rounded up to a multiple of kMinBlockSize."""
    assert [round_size(n) for n in (0, 1, 512, 513, 1024, MB + 1)] == [512, 512, 512, 1024, 1024, MB + 512]


def test_segment_sizes_by_request() -> None:
    """get_allocation_size: <= 1 MiB -> 2 MiB; < 10 MiB -> 20 MiB (kLargeBuffer); else rounded up to 2 MiB."""
    assert allocation_size(MB) == 2 * MB
    assert allocation_size(MB + 512) == 20 * MB
    assert allocation_size(10 * MB - 512) == 20 * MB
    assert allocation_size(10 * MB) == 10 * MB
    assert allocation_size(11 * MB) == 12 * MB


def test_just_over_1mib_takes_a_20mib_segment() -> None:
    """get_pool / get_allocation_size: 1 MiB + 1 is a large-pool request and gets a 20 MiB cudaMalloc."""
    a = CachingAllocator()
    a.malloc(MB + 1)
    assert a.stats.allocated_bytes.current == MB + 512
    assert a.stats.reserved_bytes.current == 20 * MB
    assert a.stats.inactive_split_bytes.current == 19 * MB - 512  # the split-off rest (alloc_found_block)


def test_11mib_takes_a_12mib_segment_whole() -> None:
    """get_allocation_size rounds 11 MiB to a 12 MiB segment; should_split keeps the 1 MiB rest attached
    (a large-pool remainder must be more than 1 MiB), so the block handed out is the whole segment."""
    a = CachingAllocator()
    a.malloc(11 * MB)
    assert a.stats.reserved_bytes.current == 12 * MB
    assert a.stats.allocated_bytes.current == 12 * MB
    assert a.stats.requested_bytes.current == 11 * MB


def test_freed_neighbours_merge_and_serve_their_sum() -> None:
    """free_block / try_merge_blocks: two freed neighbours of a segment merge into one free block, so a
    request of their sum reuses the segment without a new cudaMalloc (get_free_block finds it)."""
    a = CachingAllocator()
    x, y, z = a.malloc(6 * MB), a.malloc(6 * MB), a.malloc(8 * MB)  # 6 + 6 + 8 fill one 20 MiB segment
    assert a.stats.num_device_alloc == 1
    a.free(x)
    a.free(y)
    assert a.stats.inactive_split_bytes.current == 12 * MB
    assert a.malloc(12 * MB) == x  # the merged block starts where x did
    assert a.stats.num_device_alloc == 1
    assert a.stats.reserved_bytes.current == 20 * MB
    a.free(z)


def test_small_and_large_pools_do_not_serve_each_other() -> None:
    """get_pool: a cached small-pool block never serves a large request, nor a large block a small one."""
    a = CachingAllocator()
    a.free(a.malloc(512 * 1024))
    a.malloc(MB + MB // 2)  # large request: a new 20 MiB segment despite the free 2 MiB one
    assert a.stats.num_device_alloc == 2
    b = CachingAllocator()
    b.free(b.malloc(4 * MB))
    b.malloc(1024)  # small request: a new 2 MiB segment despite the free 20 MiB one
    assert b.stats.num_device_alloc == 2
    assert b.stats.reserved_bytes.current == 22 * MB


def test_free_blocks_serve_only_their_own_stream() -> None:
    """BlockComparatorSize / get_free_block: blocks are keyed by (stream, size, address), so a block freed
    on stream 1 is not reused by stream 0, and is by stream 1."""
    a = CachingAllocator()
    a.free(a.malloc(4 * MB, stream=1))
    a.malloc(4 * MB, stream=0)
    assert a.stats.num_device_alloc == 2
    a.malloc(4 * MB, stream=1)
    assert a.stats.num_device_alloc == 2
    assert a.stats.reserved_bytes.current == 40 * MB


def test_best_fit_takes_the_smallest_block_that_fits() -> None:
    """get_free_block: lower_bound on (stream, size) picks the smallest cached block of at least the size."""
    a = CachingAllocator()
    handles = {size: a.malloc(size * MB) for size in (12, 16, 14)}
    for handle in handles.values():
        a.free(handle)
    assert a.malloc(13 * MB) == handles[14]
    assert a.stats.allocated_bytes.current == 14 * MB  # 1 MiB left is not split off (should_split)
    assert a.stats.num_device_alloc == 3


def test_large_pool_splits_only_a_rest_over_1mib() -> None:
    """should_split, large pool: the rest is split off only when it is more than kSmallSize (1 MiB)."""
    a = CachingAllocator()
    a.malloc(19 * MB)  # 20 MiB segment, 1 MiB rest: kept in the block
    assert a.stats.allocated_bytes.current == 20 * MB
    b = CachingAllocator()
    b.malloc(19 * MB - 512)  # 20 MiB segment, 1 MiB + 512 rest: split off
    assert b.stats.allocated_bytes.current == 19 * MB - 512
    assert b.stats.inactive_split_bytes.current == MB + 512


def test_small_pool_splits_a_rest_of_512_bytes() -> None:
    """should_split, small pool: any rest of kMinBlockSize (512) or more is split off."""
    a = CachingAllocator()
    a.malloc(MB)
    a.malloc(MB - 512)  # leaves exactly 512 bytes: split
    assert a.stats.inactive_split_bytes.current == 512
    a.malloc(512)  # takes the last 512 bytes of the same 2 MiB segment
    assert a.stats.inactive_split_bytes.current == 0
    assert (a.stats.num_device_alloc, a.stats.reserved_bytes.current) == (1, 2 * MB)


def test_oversize_blocks_are_not_split_and_serve_requests_within_20mib() -> None:
    """get_free_block with max_split_size: an oversize request may take a cached oversize block less than
    max_non_split_rounding_size (kLargeBuffer, 20 MiB) larger, unsplit (should_split: request < max_split)."""
    config = AllocatorConfig(max_split_size=40 * MB)
    a = CachingAllocator(config)
    big = a.malloc(60 * MB)
    a.free(big)
    assert a.malloc(40 * MB + 512) == big  # 60 < 40 MiB + 512 + 20 MiB: served, whole
    assert a.stats.allocated_bytes.current == 60 * MB
    b = CachingAllocator(config)
    b.free(b.malloc(60 * MB))
    b.malloc(40 * MB)  # 60 >= 40 + 20: not served, a new segment
    assert b.stats.num_device_alloc == 2


def test_oversize_blocks_do_not_serve_smaller_requests() -> None:
    """get_free_block: a request below max_split_size never takes a block of max_split_size or more."""
    a = CachingAllocator(AllocatorConfig(max_split_size=40 * MB))
    a.free(a.malloc(60 * MB))
    a.malloc(30 * MB)
    assert a.stats.num_device_alloc == 2
    assert a.stats.reserved_bytes.current == 90 * MB


def test_empty_cache_frees_whole_segments_and_keeps_split_ones() -> None:
    """release_cached_blocks / release_blocks: cudaFree every cached block with no neighbour (a whole
    segment); a segment with a live block stays, with its free part."""
    a = CachingAllocator()
    a.malloc(4 * MB)  # lives in a 20 MiB segment
    a.free(a.malloc(22 * MB))  # too big for the 16 MiB left: a whole 22 MiB segment, cached
    a.free(a.malloc(1024))  # a whole 2 MiB small segment, cached
    a.empty_cache()
    assert a.stats.num_device_free == 2
    assert a.stats.reserved_bytes.current == 20 * MB
    assert a.stats.inactive_split_bytes.current == 16 * MB


def test_failed_cudamalloc_frees_the_cache_and_retries() -> None:
    """malloc -> alloc_block fails -> release_available_cached_blocks (no max_split_size: nothing) ->
    release_cached_blocks -> alloc_block(isRetry): num_alloc_retries counts that retry."""
    a = CachingAllocator(device_bytes=40 * MB)
    a.free(a.malloc(12 * MB))
    a.malloc(30 * MB)  # 12 + 30 > 40: the cached 12 MiB segment is released first
    s = a.stats
    assert (s.num_alloc_retries, s.num_device_free, s.num_ooms) == (1, 1, 0)
    assert s.reserved_bytes.current == 30 * MB


def test_out_of_memory_after_the_retry() -> None:
    """malloc: when the retry after release_cached_blocks fails too, num_ooms is counted and OutOfMemoryError
    raised; the retry was counted on entry to alloc_block."""
    a = CachingAllocator(device_bytes=40 * MB)
    a.malloc(30 * MB)
    with pytest.raises(AllocatorOOM) as raised:
        a.malloc(12 * MB)
    assert (a.stats.num_alloc_retries, a.stats.num_ooms) == (1, 1)
    assert raised.value.size == 12 * MB and raised.value.reserved == 30 * MB
    assert str(12 * MB) in str(raised.value) and str(30 * MB) in str(raised.value)


def test_release_one_oversize_block_without_a_retry() -> None:
    """release_available_cached_blocks: with max_split_size set, the smallest cached block of at least
    max(request, max_split_size) is freed and alloc_block tried again, not counted as a retry."""
    a = CachingAllocator(AllocatorConfig(max_split_size=40 * MB), device_bytes=120 * MB)
    a.free(a.malloc(50 * MB))
    a.free(a.malloc(60 * MB))
    a.malloc(30 * MB)  # 110 + 30 > 120: the 50 MiB block goes
    s = a.stats
    assert (s.num_device_free, s.num_alloc_retries, s.reserved_bytes.current) == (1, 0, 90 * MB)


def test_release_several_oversize_blocks_from_the_largest() -> None:
    """release_available_cached_blocks: no single block is large enough, so oversize blocks are freed from
    the largest down until their bytes reach the request."""
    a = CachingAllocator(AllocatorConfig(max_split_size=20 * MB), device_bytes=120 * MB)
    a.free(a.malloc(30 * MB))
    a.free(a.malloc(40 * MB))
    a.malloc(60 * MB)  # 70 + 60 > 120; 40 then 30 are freed
    s = a.stats
    assert (s.num_device_free, s.num_alloc_retries, s.reserved_bytes.current) == (2, 0, 60 * MB)


def test_garbage_collection_frees_the_oldest_cached_blocks() -> None:
    """garbage_collect_cached_blocks (armed by a memory fraction and a threshold): before a new cudaMalloc
    with more than threshold x allowed bytes held, unsplit large blocks at least as old as the mean age
    (free-block searches since cached, counted by get_free_block) are freed."""
    config = AllocatorConfig(garbage_collection_threshold=0.5, per_process_memory_fraction=1.0)
    a = CachingAllocator(config, device_bytes=200 * MB)
    x = a.malloc(30 * MB)  # search 1
    y = a.malloc(30 * MB)  # search 2
    a.free(x)  # cached at age base 2
    a.malloc(12 * MB, stream=1)  # search 3; 60 MiB held <= 100: no collection
    a.free(y)  # cached at base 3
    a.malloc(40 * MB, stream=1)  # search 4; 72 <= 100: no collection; 112 MiB held
    a.malloc(20 * MB, stream=2)  # search 5: ages 3 and 2, mean 2.5: x's segment goes, y's stays
    s = a.stats
    assert s.num_device_free == 1
    assert s.reserved_bytes.current == (112 - 30 + 20) * MB
    assert a.malloc(30 * MB) == y


def test_garbage_collection_needs_a_memory_fraction() -> None:
    """malloc: garbage collection runs only when set_per_process_memory_fraction was called (set_fraction)."""
    a = CachingAllocator(AllocatorConfig(garbage_collection_threshold=0.5), device_bytes=200 * MB)
    x = a.malloc(30 * MB)
    a.free(x)
    a.malloc(12 * MB, stream=1)
    a.malloc(140 * MB, stream=2)  # no fraction set: the cached 30 MiB segment is not collected
    assert a.stats.num_device_free == 0


def test_memory_fraction_caps_the_held_bytes() -> None:
    """alloc_block: with a fraction set, a segment that would take the held bytes past fraction x device
    fails like a cudaMalloc would."""
    a = CachingAllocator(AllocatorConfig(per_process_memory_fraction=0.5), device_bytes=100 * MB)
    a.malloc(40 * MB)
    with pytest.raises(AllocatorOOM):
        a.malloc(12 * MB)


def test_zero_bytes_and_bad_handles() -> None:
    """NativeCachingAllocator::allocate: 0 bytes never reach malloc (a null pointer); free of an unknown
    pointer is an error ("invalid device pointer")."""
    a = CachingAllocator()
    assert a.malloc(0) == 0
    a.free(0)
    assert a.stats.num_device_alloc == 0
    with pytest.raises(ValueError, match="invalid device pointer"):
        a.free(12345)


def test_reset_peak_restarts_peaks_from_current() -> None:
    """resetPeakStats: every peak becomes its current value."""
    a = CachingAllocator()
    a.free(a.malloc(30 * MB))
    a.reset_peak()
    assert a.stats.allocated_bytes.peak == 0
    assert a.stats.reserved_bytes.peak == 30 * MB
    assert a.stats.as_dict()["reserved_bytes.all.peak"] == 30 * MB
