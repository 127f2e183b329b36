"""Replaying allocation streams (:mod:`store.alloc_stream`) through the allocator port, phase by phase;
the peaks are torch's (``increase_stat`` / ``resetPeakStats`` of ``CUDACachingAllocator.cpp``)."""

from __future__ import annotations

import random

import pytest

from search.allocator import AllocatorConfig, replay
from store.alloc_stream import AllocStream, StreamBuilder

MB = 1 << 20


def _random_stream(seed: int, events: int = 3000) -> AllocStream:
    rng = random.Random(seed)
    b = StreamBuilder()
    live: list[int] = []
    for i in range(events):
        if i % 500 == 0:
            b.phase(f"phase{i // 500 % 3}")
        roll = rng.random()
        if roll < 0.55 or not live:
            size = rng.choice([rng.randrange(1, 4096), rng.randrange(1, 2 * MB), rng.randrange(MB, 200 * MB)])
            live.append(b.alloc(size, stream=rng.choice([0, 0, 0, 1])))
        elif roll < 0.99:
            b.free(live.pop(rng.randrange(len(live))))
        else:
            b.empty_cache()
    return b.build()


@pytest.mark.parametrize("config", [AllocatorConfig(), AllocatorConfig(expandable_segments=True)])
def test_peaks_of_a_random_stream(config: AllocatorConfig) -> None:
    """requested_bytes counts each block's requested_size (alloc_found_block), so its peak is the live
    tensors' peak; allocated (rounded blocks) and reserved (segments) can only be larger."""
    stream = _random_stream(seed=7)
    result = replay(stream, config)
    assert result.peak_requested == stream.live_peak()
    assert result.peak_reserved >= result.peak_allocated >= result.peak_requested
    assert not result.oom
    for phase in result.phases:
        assert phase.peak_reserved >= phase.end_reserved
        assert phase.peak_reserved >= phase.peak_allocated >= phase.end_allocated


def test_phases_in_order_with_a_start_phase_and_their_counts() -> None:
    """Events before the first PHASE marker form "start"; each marker opens a phase; a phase's counts are its
    own and add up to the run's (num_device_alloc / num_device_free deltas)."""
    b = StreamBuilder()
    x = b.alloc(30 * MB)
    b.phase("forward")
    y = b.alloc(40 * MB)
    b.free(x)
    b.phase("backward")
    b.free(y)
    b.empty_cache()
    result = replay(b.build())
    assert [p.name for p in result.phases] == ["start", "forward", "backward"]
    start, forward, backward = result.phases
    assert (start.peak_reserved, forward.peak_reserved, backward.peak_reserved) == (30 * MB, 70 * MB, 70 * MB)
    assert (backward.end_reserved, backward.cuda_frees) == (0, 2)
    assert sum(p.cuda_mallocs for p in result.phases) == result.cuda_mallocs == 2
    assert forward.peak_requested == 70 * MB
    assert result.phase("forward") is forward


def test_no_start_phase_when_the_stream_opens_with_a_marker() -> None:
    """A stream that starts with a PHASE marker has no "start" phase; an empty phase is still reported."""
    b = StreamBuilder()
    b.phase("init")
    b.phase("step")
    b.alloc(1)
    result = replay(b.build())
    assert [p.name for p in result.phases] == ["init", "step"]
    assert result.phases[0].peak_reserved == 0
    assert result.phases[1].peak_reserved == 2 * MB


def test_out_of_memory_stops_the_replay_without_raising() -> None:
    """malloc's OutOfMemoryError (num_ooms) ends the replay; the result and the phase it hit say so."""
    b = StreamBuilder()
    b.phase("load")
    b.alloc(30 * MB)
    b.phase("step")
    b.alloc(30 * MB)
    b.alloc(30 * MB)
    b.phase("never")
    result = replay(b.build(), device_bytes=64 * MB)
    assert result.oom and result.oom_event == 4
    assert [p.name for p in result.phases] == ["load", "step"]
    step = result.phases[-1]
    assert (step.oom, step.ooms, step.alloc_retries) == (True, 1, 1)
    assert not result.phases[0].oom


def test_timeline_has_a_sample_per_event() -> None:
    """timeline=True: one (event index, requested, allocated, reserved) sample per event, phase markers
    included, for plotting."""
    b = StreamBuilder()
    x = b.alloc(3 * MB)
    b.phase("next")
    b.free(x)
    b.empty_cache()
    result = replay(b.build(), timeline=True)
    assert result.timeline == (
        (0, 3 * MB, 3 * MB, 20 * MB),
        (1, 3 * MB, 3 * MB, 20 * MB),
        (2, 0, 0, 20 * MB),
        (3, 0, 0, 0),
    )
    assert replay(b.build()).timeline == ()


def test_frees_of_unknown_keys_and_zero_byte_requests_are_ignored() -> None:
    """allocate(0) is a null pointer (no malloc); a FREE of a key never allocated does nothing, as
    AllocStream.live_peak ignores it."""
    stream = AllocStream(((0, 1, 0, 0, 0), (1, 1, 0, 0, 0), (1, 99, 0, 0, 0), (0, 2, 100, 0, 0)))
    result = replay(stream)
    assert (result.peak_requested, result.cuda_mallocs) == (100, 1)


def test_streams_and_config_reach_the_allocator() -> None:
    """Each ALLOC's CUDA stream keys its block (BlockComparatorSize); the config's rules apply."""
    b = StreamBuilder()
    b.free(b.alloc(4 * MB, stream=1))
    b.alloc(4 * MB, stream=0)
    assert replay(b.build()).cuda_mallocs == 2
    assert replay(b.build(), AllocatorConfig(expandable_segments=True)).peak_reserved == 40 * MB
