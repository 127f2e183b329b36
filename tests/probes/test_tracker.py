"""The CPU live-tensor tracker: exact bytes for known allocations, views counted once, frees, the cap."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from probes.measure.tracker import LiveTensorTracker, ProbeOOM  # noqa: E402


def test_known_sizes_give_exact_current_and_peak() -> None:
    with LiveTensorTracker() as tracker:
        a = torch.empty(1000, dtype=torch.float32)  # 4000 bytes
        assert (tracker.current, tracker.peak) == (4000, 4000)
        b = torch.empty(250, dtype=torch.float64)  # 2000 bytes
        c = torch.empty(64, dtype=torch.bfloat16)  # 128 bytes
        assert (tracker.current, tracker.peak) == (6128, 6128)
        del a
        assert (tracker.current, tracker.peak) == (2128, 6128)
        del b, c
        assert (tracker.current, tracker.peak) == (0, 6128)


def test_views_inplace_and_aliases_do_not_double_count() -> None:
    with LiveTensorTracker() as tracker:
        a = torch.zeros(10, 100)  # 4000 bytes
        views = [a.view(100, 10), a[1:], a.t(), a.detach(), a.reshape(-1), a.data, a[:, ::2]]
        a.add_(1.0)
        a.mul_(2.0)
        torch.add(a, 1.0, out=a)
        assert tracker.current == 4000
        assert tracker.storages == 1
        del a
        assert tracker.current == 4000  # the views keep the storage alive
        views.clear()
        assert tracker.current == 0


def test_temporaries_show_in_the_peak_and_reset_starts_a_new_window() -> None:
    with LiveTensorTracker() as tracker:
        keep = torch.ones(256)  # 1024 bytes
        (keep * 2).sum()  # a 1024-byte temporary and a 4-byte scalar, both freed at once
        assert tracker.current == 1024
        assert tracker.peak == 1024 + 1024 + 4
        tracker.reset_peak()
        assert tracker.peak == 1024
        big = torch.empty(10_000, dtype=torch.uint8)
        del big
        assert (tracker.current, tracker.peak) == (1024, 11_024)


def test_autograd_gradients_are_counted() -> None:
    with LiveTensorTracker() as tracker:
        x = torch.ones(100, requires_grad=True)  # 400 bytes
        loss = (x * 3.0).sum()
        loss.backward()
        del loss
        assert x.grad is not None
        assert tracker.current == 800  # the parameter and its gradient


def test_untracked_before_start_unless_track_existing() -> None:
    before = torch.empty(500, dtype=torch.float32)  # 2000 bytes, made before tracking
    view = before.view(-1)
    layer = torch.nn.Linear(10, 10)  # 440 bytes of weight and bias
    with LiveTensorTracker() as tracker:
        assert tracker.current == 0
        added = tracker.track_existing([before, view, layer.weight, layer.bias])
        assert added == 2440 and tracker.current == 2440
        assert tracker.track_existing([before]) == 0  # counted once
        del before, view
        assert tracker.current == 440
    del layer


def test_track_existing_walks_the_garbage_collector() -> None:
    held = torch.empty(12_345, dtype=torch.uint8)
    with LiveTensorTracker() as tracker:
        assert tracker.track_existing() >= 12_345
        after = tracker.current
        del held
        assert tracker.current == after - 12_345


def test_storage_resize_bypassing_the_dispatcher_is_seen() -> None:
    with LiveTensorTracker() as tracker:
        t = torch.empty(100, dtype=torch.float32)
        t.untyped_storage().resize_(0)  # as ZeRO-3 frees a partition
        assert tracker.current == 0
        t.untyped_storage().resize_(40)
        assert tracker.current == 40
        del t
        assert tracker.current == 0
    assert torch.UntypedStorage.resize_.__name__ == "resize_"


def test_meta_tensors_and_allocations_outside_the_block_are_ignored() -> None:
    tracker = LiveTensorTracker()
    with tracker:
        torch.empty(1000, device="meta")
        assert tracker.current == 0
        kept = torch.empty(10)
    outside = torch.empty(1000)
    assert tracker.current == 40
    del kept, outside
    assert tracker.current == 0


def test_cap_raises_probe_oom_and_leaves_counts_consistent() -> None:
    with LiveTensorTracker(cap_bytes=10_000) as tracker:
        a = torch.empty(2000, dtype=torch.float32)  # 8000 bytes: fits
        with pytest.raises(ProbeOOM, match="over the cap of 10000 bytes") as info:
            torch.empty(1000, dtype=torch.float32)  # 4000 more: over the cap
        assert isinstance(info.value, MemoryError)
        assert tracker.current == 8000
        small = torch.empty(500, dtype=torch.float32)  # 2000 more: exactly at the cap
        assert tracker.current == tracker.peak == 10_000
        del a, small
        assert tracker.current == 0


def test_tracker_is_not_reentrant() -> None:
    tracker = LiveTensorTracker()
    with tracker, pytest.raises(RuntimeError, match="already active"):
        tracker.__enter__()
