"""``record_stream`` in the allocator port: a free whose block has a pending use on another stream.

Each rule follows ``c10/cuda/CUDACachingAllocator.cpp`` (commit 001074d25084): ``free`` of a block with
``stream_uses`` calls ``insert_events`` (the block is not returned to its pool, ``allocated`` falls, ``active``
and ``requested`` stay); ``malloc`` starts with ``process_events``, which returns the blocks whose events have
completed in the order they were freed and stops at the first one not completed; ``release_cached_blocks``
(``empty_cache``) first runs ``synchronize_and_free_events``.
"""

from __future__ import annotations

from search.allocator import CachingAllocator, replay
from store.alloc_stream import EVENT, FREE, StreamBuilder

MB = 1 << 20
SIZE = 64 * MB  # a large-pool request whose segment is exactly its size (a multiple of 2 MiB, over 10 MiB)


def test_a_block_freed_pending_is_not_reused_until_its_event() -> None:
    """The next malloc of the same size cannot take the waiting block: a second segment is made; once the event
    has completed the malloc after it takes the returned block, and no third segment is made."""
    a = CachingAllocator()
    a.free(a.malloc(SIZE), event=1)
    second = a.malloc(SIZE)
    assert a.stats.segment.current == 2
    a.free(second)
    a.complete(1)
    a.malloc(SIZE)
    a.malloc(SIZE)  # the first block (returned) and the second (freed plainly): both reused
    assert a.stats.segment.current == 2
    assert a.stats.reserved_bytes.current == 2 * SIZE


def test_without_a_pending_use_the_same_sequence_keeps_one_segment() -> None:
    """The same frees without events: each malloc reuses the freed block (the contrast to the rule above)."""
    a = CachingAllocator()
    a.free(a.malloc(SIZE))
    a.malloc(SIZE)
    assert a.stats.segment.current == 1


def test_each_pending_gradient_makes_its_own_segment_until_a_synchronize() -> None:
    """Three blocks freed pending one after the other make three segments; after a synchronize the next three
    requests fit in them (no new segment)."""
    a = CachingAllocator()
    for event in (1, 2, 3):
        a.free(a.malloc(SIZE), event=event)
    assert a.stats.segment.current == 3
    a.synchronize()
    for _ in range(3):
        a.malloc(SIZE)
    assert a.stats.segment.current == 3
    assert a.stats.num_device_alloc == 3


def test_events_return_in_free_order_and_stop_at_the_first_not_completed() -> None:
    """process_events stops at the first event not completed: a block waiting for event 2, freed first, holds
    back one waiting for event 1 freed after it, until event 2 has completed too."""
    a = CachingAllocator()
    a.free(a.malloc(SIZE), event=2)
    a.free(a.malloc(SIZE), event=1)
    a.complete(1)
    a.malloc(SIZE)
    assert a.stats.segment.current == 3
    a.complete(2)
    a.malloc(SIZE)
    a.malloc(SIZE)
    assert a.stats.segment.current == 3


def test_allocated_falls_at_the_free_active_and_requested_when_returned() -> None:
    """free lowers allocated; free_block (at process_events) lowers active and requested."""
    a = CachingAllocator()
    a.free(a.malloc(SIZE - 100), event=1)
    stats = a.stats.as_dict()
    assert stats["allocated_bytes.all.current"] == 0
    assert stats["active_bytes.all.current"] == SIZE
    assert stats["requested_bytes.all.current"] == SIZE - 100
    assert stats["active_bytes.all.peak"] == SIZE
    a.complete(1)
    a.malloc(MB)  # process_events returns the block before this request takes the small pool
    stats = a.stats.as_dict()
    assert stats["active_bytes.all.current"] == MB  # only the 1 MiB request is active
    assert stats["requested_bytes.all.current"] == MB


def test_a_waiting_block_is_not_merged_into_a_freed_neighbour() -> None:
    """try_merge_blocks passes over a block with events outstanding: freeing its neighbour leaves the two
    apart, so a request of the whole segment needs a new one; after the event they merge back."""
    a = CachingAllocator()
    whole = a.malloc(2 * SIZE)
    a.free(whole)
    first, second = a.malloc(SIZE), a.malloc(SIZE)  # the segment split in two
    a.free(first, event=1)
    a.free(second)
    a.malloc(2 * SIZE)
    assert a.stats.segment.current == 2
    a.complete(1)
    a.malloc(2 * SIZE)  # the first segment, merged whole again
    assert a.stats.segment.current == 2


def test_empty_cache_returns_waiting_blocks_and_releases_their_segments() -> None:
    """release_cached_blocks runs synchronize_and_free_events first: a waiting block's segment is released."""
    a = CachingAllocator()
    a.free(a.malloc(SIZE), event=5)
    a.empty_cache()
    assert a.stats.reserved_bytes.current == 0
    assert a.stats.num_sync_all_streams == 1


def test_replay_of_a_stream_with_pending_frees_and_events() -> None:
    """The stream's FREE carries the event and EVENT completes it: the replay makes the segments the allocator
    rules above make; on one stream (a device without side streams) nothing waits."""
    out = StreamBuilder()
    out.phase("backward")
    for event in (1, 2):
        out.free(out.alloc(SIZE, "gradients"), event=event)
    out.event(1)
    out.free(out.alloc(SIZE, "gradients"))
    stream = out.build()
    assert (FREE, 1, 1, 0, 0) in stream.events and (EVENT, 1, 0, 0, 0) in stream.events
    assert replay(stream).peak_reserved == 2 * SIZE  # the third request takes the block event 1 returned
    assert replay(stream.on_one_stream()).peak_reserved == SIZE
    assert out.last_event == 1
