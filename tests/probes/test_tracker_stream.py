"""The CPU tracker's allocation stream: one event per change of the live bytes, markers where the clock
puts them, and per-phase peaks that equal the tracker's own (torch only, no DeepSpeed)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from probes.measure.tracker import LiveTensorTracker, ProbeOOM  # noqa: E402
from probes.step.phases import PhaseClock  # noqa: E402
from store.alloc_stream import ALLOC, EMPTY_CACHE, FREE, KIND_INDEX, PHASE, AllocStream  # noqa: E402
from store.stream_phases import STEP_MARK, WARMUP_MARK, phase_live_peaks  # noqa: E402


def running_sums(stream: AllocStream) -> list[int]:
    """The live requested bytes after every event."""
    live: dict[int, int] = {}
    current, sums = 0, []
    for op, key, size, _, _ in stream:
        if op == ALLOC:
            assert key not in live, "a key is alive once"
            live[key] = size
            current += size
        elif op == FREE:
            current -= live.pop(key)
        sums.append(current)
    return sums


def test_allocations_and_frees_become_events_with_fresh_keys() -> None:
    with LiveTensorTracker(record_stream=True) as tracker:
        a = torch.empty(1000, dtype=torch.float32)
        view = a.view(10, 100)  # same storage: no event
        b = torch.empty(250, dtype=torch.float64)
        del a, view
        c = torch.empty(1000, dtype=torch.float32)  # may reuse a's id(): still a new key
        del b, c
    stream = tracker.stream()
    assert [(op, size) for op, _, size, _, _ in stream] == [
        (ALLOC, 4000),
        (ALLOC, 2000),
        (FREE, 0),
        (ALLOC, 4000),
        (FREE, 0),
        (FREE, 0),
    ]
    keys = [key for op, key, *_ in stream if op == ALLOC]
    assert keys == sorted(set(keys))
    assert stream.live_peak() == tracker.peak == 6000
    assert running_sums(stream)[-1] == tracker.current == 0


def test_resize_is_a_free_and_an_alloc_and_zero_is_a_free_only() -> None:
    with LiveTensorTracker(record_stream=True) as tracker:
        storage = torch.empty(100, dtype=torch.uint8).untyped_storage()
        storage.resize_(300)
        storage.resize_(0)
        storage.resize_(50)  # refilled, as ZeRO-3 refills a partition
        assert tracker.current == 50
    ops = [(op, size) for op, _, size, _, _ in tracker.stream()]
    assert ops == [(ALLOC, 100), (FREE, 0), (ALLOC, 300), (FREE, 0), (ALLOC, 50)]
    assert running_sums(tracker.stream())[-1] == 50


def test_the_cap_records_nothing_for_the_refused_allocation() -> None:
    with LiveTensorTracker(cap_bytes=10_000, record_stream=True) as tracker:
        keep = torch.empty(2000, dtype=torch.uint8)
        with pytest.raises(ProbeOOM):
            torch.empty(9000, dtype=torch.uint8)
        assert keep.numel() == 2000
    assert [op for op, *_ in tracker.stream()] == [ALLOC]


def test_recording_off_keeps_an_empty_stream_and_the_same_counts() -> None:
    with LiveTensorTracker() as tracker:
        x = torch.ones(64)
        tracker.mark_phase("forward", reset_peak=True)
        tracker.mark_empty_cache()
        del x
    assert len(tracker.stream()) == 0 and tracker.current == 0 and tracker.peak == 256


def test_kinds_label_parameters_gradients_and_optimizer_states() -> None:
    with LiveTensorTracker(record_stream=True) as tracker:
        layer = torch.nn.Linear(8, 4, bias=False)
        optimizer = torch.optim.Adam(layer.parameters())
        layer(torch.ones(2, 8)).sum().backward()
        optimizer.step()
        labelled = tracker.label_kinds()
    kinds = {
        KIND_INDEX["parameters"]: layer.weight,
        KIND_INDEX["gradients"]: layer.weight.grad,
        KIND_INDEX["optimizer_states"]: optimizer.state[layer.weight]["exp_avg"],
    }
    allocs = [event for event in tracker.stream() if event[0] == ALLOC]
    for kind in kinds:
        assert any(event[4] == kind and event[2] == 4 * 8 * 4 for event in allocs), kind
    assert labelled >= 4  # weight, grad, exp_avg, exp_avg_sq


def test_track_existing_labels_what_it_finds() -> None:
    layer, other = torch.nn.Linear(4, 4, bias=False), torch.zeros(3)
    with LiveTensorTracker(record_stream=True) as tracker:
        tracker.track_existing([layer.weight, other])
    kinds = [event[4] for event in tracker.stream()]
    assert kinds == [KIND_INDEX["parameters"], KIND_INDEX["other"]]


def test_phase_windows_of_the_stream_equal_the_clock_measurements() -> None:
    """A two-layer MLP trained three steps (one warm-up) under the clock: every phase's peak from the stream
    equals the clock's measured peak, the setup window equals the tracker's, and empty_cache is recorded."""
    with LiveTensorTracker(record_stream=True) as tracker:
        tracker.track_existing([])
        tracker.mark_phase("setup")
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
        optimizer = torch.optim.AdamW(model.parameters())
        setup_peak = tracker.peak
        clock = PhaseClock("cpu", "after-phase", tracker)
        for step in range(3):
            clock.start_step(measured=step > 0)
            for _ in range(2):  # two micro-steps
                batch = torch.randn(16, 32)  # between phases: in the step's stretch
                with clock.phase("forward"):
                    loss = model(batch).pow(2).mean()
                with clock.phase("backward"):
                    loss.backward()
                del loss
            with clock.phase("optimizer_step"):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                clock.end_step()
            clock.finish_step(measured=step > 0)
    stream = tracker.stream()
    measured = {m.name: m.peak_allocated_bytes for m in clock.measurements()}
    peaks = phase_live_peaks(stream)
    assert {name: peaks[name] for name in measured} == measured
    assert peaks["setup"] == setup_peak
    assert set(stream.phases) == {"setup", "forward", "backward", "optimizer_step", STEP_MARK, WARMUP_MARK}
    assert sum(op == EMPTY_CACHE for op, *_ in stream) == clock.cache_calls == 3 * 5
    assert sum(op == PHASE for op, *_ in stream) == 1 + 3 * (1 + 2 * 5)  # setup; per step: start, 5 phases x 2
    assert max(running_sums(stream)) == stream.live_peak()
