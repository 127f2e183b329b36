"""CUDA allocator snapshots to allocation streams and back (``store.cuda_snapshot``), on hand-built snapshots
shaped as ``torch.cuda.memory._snapshot()`` returns them, and PyTorch's own ``_memory_viz`` reading the
snapshots built from streams."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from store.alloc_stream import ALLOC, EMPTY_CACHE, FREE, KIND_INDEX, PHASE, AllocStream, StreamBuilder
from store.cuda_snapshot import reserved_peak, segment_events, snapshot_to_stream, stream_to_snapshot
from store.stream_phases import STEP_MARK

MIB = 2**20
SIDE_STREAM = 0x55AA00  # a cudaStream_t as the trace shows it


def entry(action: str, addr: int, size: int, stream: int = 0) -> dict[str, Any]:
    """A trace entry as torch records it (frames shortened to one)."""
    return {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": 0,
            "frames": [{"filename": "train.py", "line": 1, "name": "step"}]}  # fmt: skip


def free(addr: int, size: int) -> list[dict[str, Any]]:
    return [entry("free_requested", addr, size), entry("free_completed", addr, size)]


def segment(addr: int, size: int, blocks: list[tuple[int, int, str]]) -> dict[str, Any]:
    """A final segment with blocks (size, requested size, state)."""
    return {
        "device": 0, "address": addr, "total_size": size, "stream": 0, "segment_type": "large",
        "segment_pool_id": (0, 0), "allocated_size": sum(b[0] for b in blocks if b[2] == "active_allocated"),
        "active_size": sum(b[0] for b in blocks if b[2] == "active_allocated"),
        "requested_size": sum(b[1] for b in blocks if b[2] == "active_allocated"),
        "blocks": [{"size": s, "requested_size": r, "state": st, "frames": []} for s, r, st in blocks],
    }  # fmt: skip


def empty_cache_snapshot() -> dict[str, Any]:
    """Two segments; the large one's block is freed and ``empty_cache()`` returns it (segment_free) while the
    small one still holds a live block; then a new large segment. An allocation from before the trace is
    freed, and one allocation runs on a side stream."""
    small, large, later = 0x7F0000000000, 0x7F0000200000, 0x7F0002000000
    trace = [
        entry("segment_alloc", small, 2 * MIB),
        entry("alloc", small, 1000),  # requested 1000 bytes, the block is 1024
        entry("alloc", small + 1024, 4000, SIDE_STREAM),
        *free(small, 1000),
        *free(0x7E0000000000, 512),  # allocated before recording began: no event
        entry("segment_alloc", large, 20 * MIB),
        entry("alloc", large, 15 * MIB + 3),
        *free(large, 15 * MIB + 3),
        entry("segment_free", large, 20 * MIB),  # torch.cuda.empty_cache()
        entry("segment_alloc", later, 20 * MIB),
        entry("alloc", later, 12 * MIB),
        {"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "frames": []},
    ]
    small_blocks = [(1024, 0, "inactive"), (4096, 4000, "active_allocated"), (2 * MIB - 5120, 0, "inactive")]
    segments = [
        segment(small, 2 * MIB, small_blocks),
        segment(later, 20 * MIB, [(12 * MIB, 12 * MIB, "active_allocated"), (8 * MIB, 0, "inactive")]),
    ]
    return {"segments": segments, "device_traces": [trace]}


def test_a_trace_becomes_requested_allocations_frees_and_empty_cache() -> None:
    stream = snapshot_to_stream(empty_cache_snapshot())
    assert list(stream) == [
        (ALLOC, 1, 1000, 0, 0),
        (ALLOC, 2, 4000, 1, 0),  # the side stream is stream 1
        (FREE, 1, 0, 0, 0),
        (ALLOC, 3, 15 * MIB + 3, 0, 0),
        (FREE, 3, 0, 0, 0),
        (EMPTY_CACHE, 0, 0, 0, 0),
        (ALLOC, 4, 12 * MIB, 0, 0),
    ]
    assert stream.live_peak() == 4000 + 15 * MIB + 3


def test_segment_events_and_the_reserved_peak() -> None:
    snapshot = empty_cache_snapshot()
    assert segment_events(snapshot) == [
        ("segment_alloc", 2 * MIB),
        ("segment_alloc", 20 * MIB),
        ("segment_free", 20 * MIB),
        ("segment_alloc", 20 * MIB),
    ]
    assert reserved_peak(snapshot) == 22 * MIB
    warm = dict(snapshot, segments=[*snapshot["segments"], segment(0x10000, 2 * MIB, [(2 * MIB, 0, "inactive")])])
    assert reserved_peak(warm) == 24 * MIB  # a segment from before the trace counts throughout


def test_a_release_that_leaves_free_segments_is_the_allocator_retrying_not_empty_cache() -> None:
    """cudaMalloc of 30 MiB fails; the allocator frees one cached 20 MiB segment and retries; a 2 MiB
    segment stays cached and free, which empty_cache would have returned too."""
    a, b, c = 0x1000000, 0x3000000, 0x5000000
    trace = [
        entry("segment_alloc", a, 20 * MIB),
        entry("segment_alloc", b, 2 * MIB),
        entry("alloc", a, 20 * MIB),
        entry("alloc", b, 1 * MIB),
        *free(a, 20 * MIB),
        *free(b, 1 * MIB),
        entry("segment_free", a, 20 * MIB),
        entry("segment_alloc", c, 30 * MIB),
        entry("alloc", c, 30 * MIB),
    ]
    stream = snapshot_to_stream({"segments": [], "device_traces": [trace]})
    assert EMPTY_CACHE not in [op for op, *_ in stream]
    assert [size for op, _, size, _, _ in stream if op == ALLOC] == [20 * MIB, MIB, 30 * MIB]


def test_expandable_segments_unmapping_is_empty_cache() -> None:
    base = 0x7F0000000000
    trace = [
        entry("segment_map", base, 20 * MIB),
        entry("alloc", base, 10 * MIB),
        *free(base, 10 * MIB),
        entry("segment_unmap", base, 20 * MIB),
        entry("segment_map", base, 20 * MIB),
        entry("alloc", base, 4 * MIB),
    ]
    stream = snapshot_to_stream({"segments": [], "device_traces": [[], trace]})  # the first device with a trace
    assert [op for op, *_ in stream] == [ALLOC, FREE, EMPTY_CACHE, ALLOC]
    assert snapshot_to_stream({"segments": [], "device_traces": [[], trace]}, device=0) == AllocStream(())


def cpu_like_stream() -> AllocStream:
    """What a CPU probe records: setup, a warm-up-less step with phases, kinds and an empty_cache."""
    b = StreamBuilder()
    weights = b.alloc(4096, "parameters")
    b.phase("setup")
    states = b.alloc(8192, "optimizer_states")
    b.phase(STEP_MARK)
    b.phase("forward")  # two markers at one place
    act = b.alloc(1000, "activations")
    logits = b.alloc(10**9 + 1, "logits")
    b.phase(STEP_MARK)
    b.phase("backward")
    b.free(logits)
    b.free(act)
    b.empty_cache()
    b.phase(STEP_MARK)
    b.free(states)
    b.phase("teardown")  # a marker after the last event
    del weights
    return b.build()


def test_a_stream_round_trips_through_a_snapshot() -> None:
    stream = cpu_like_stream()
    snapshot = stream_to_snapshot(stream)
    assert snapshot_to_stream(snapshot) == stream
    assert snapshot_to_stream(pickle.loads(pickle.dumps(snapshot))) == stream
    trace = snapshot["device_traces"][0]
    assert [e["action"] for e in trace][:3] == ["alloc", "alloc", "alloc"]
    assert {e["addr"] for e in trace if e["action"] == "alloc"} == {0, 4096, 4096 + 8192, 4096 + 8192 + 1024}
    assert sum(e["action"] == "empty_cache" for e in trace) == 1
    assert all(e["frames"] == [] for e in trace)
    (seg,) = snapshot["segments"]
    assert sum(block["size"] for block in seg["blocks"]) == seg["total_size"]
    assert [b["requested_size"] for b in seg["blocks"] if b["state"] == "active_allocated"] == [4096]
    assert segment_events(snapshot) == [] and reserved_peak(snapshot) == seg["total_size"]


def test_kinds_survive_the_round_trip() -> None:
    kinds = [e[4] for e in snapshot_to_stream(stream_to_snapshot(cpu_like_stream())) if e[0] == ALLOC]
    assert kinds == [KIND_INDEX[k] for k in ("parameters", "optimizer_states", "activations", "logits")]


def test_an_empty_stream_is_an_empty_snapshot() -> None:
    snapshot = stream_to_snapshot(AllocStream(()))
    assert snapshot["segments"] == [] and snapshot["device_traces"] == [[]]
    assert snapshot_to_stream(snapshot) == AllocStream(())
    assert PHASE not in [e[0] for e in snapshot_to_stream({"device_traces": []})]


def test_torch_memory_viz_reads_a_snapshot_built_from_a_stream() -> None:
    """PyTorch's own readers of snapshots, on the CPU: the text trace, the segment summary (which checks that
    blocks add up to each segment), the flame-graph inputs, and the HTML pages of memory_viz."""
    viz = pytest.importorskip("torch.cuda._memory_viz")
    snapshot = stream_to_snapshot(cpu_like_stream())
    text = viz.trace(snapshot)
    assert "entries" in text and text.count("free completed") == 3 and "empty_cache" in text
    summary = viz.segsum(snapshot)
    assert "segments: 1" in summary and "total_allocated: 4.0KiB" in summary
    assert "active_allocated;<non-python> 4096" in viz.segments(snapshot, format_flamegraph=lambda lines: lines)
    lines = viz.memory(snapshot, format_flamegraph=lambda lines: lines).splitlines()
    assert "stream_0;active_allocated;<non-python> 4096" in lines and any("inactive;<gaps>" in x for x in lines)
    for page in (viz.trace_plot(snapshot), viz.segment_plot(snapshot)):
        assert page.startswith("\n<!DOCTYPE html>") and "snapshot.pickle" in page
    assert viz.filter_alloc_free_pairs(pickle.loads(pickle.dumps(snapshot)))["device_traces"][0]
