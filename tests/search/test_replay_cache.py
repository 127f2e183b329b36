"""What the replay's caches hold stays bounded by what they hold, across many different jobs (issue 45: the
prediction snapshot grew to ~10 GB because the replay cache kept 2048 streams, whatever their size)."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest

from search.coefficients import Coefficients
from search.single.predict import single_step
from search.step import replayed
from search.step.assemble import Step
from search.step.replayed import StepReplayed, replay_step
from search.step.weighed_cache import WeighedCache
from store.alloc_stream import AllocStream
from store.gpus import get_gpu
from store.models import get_model
from store.records import Hardware, Strategy, Workload

COEF = Coefficients()


def _step(micro_batch: int, seq_len: int) -> Step:
    spec = get_gpu("H100-80G")
    hardware = Hardware(gpu=spec, gpu_memory_bytes=spec.memory_bytes, gpus=1, cpu_memory_bytes=512 * 2**30)
    workload = Workload(kind="sft", model=get_model("opt-125m"), seq_len=seq_len, global_batch=micro_batch)
    return single_step(workload, Strategy(zero_stage=0, micro_batch=micro_batch), hardware, COEF)


def _track_new_streams(monkeypatch: pytest.MonkeyPatch) -> list[weakref.ref[AllocStream]]:
    """Weak references to every AllocStream made from now on (each is made through its dataclass ``__init__``,
    ``dataclasses.replace`` too): what is alive of them is read from these instead of scanning every object of
    the process (``gc.get_objects``), whose cost grows with everything the other tests of a worker left on the
    heap. ``__init__`` is wrapped, not ``__new__``: a ``__new__`` set on the class and then deleted leaves
    CPython's slot calling ``object.__new__`` with the fields ("takes exactly one argument") for every later test
    of the worker."""
    made: list[weakref.ref[AllocStream]] = []
    init = AllocStream.__init__

    def tracked_init(stream: AllocStream, *args: Any, **kwargs: Any) -> None:
        init(stream, *args, **kwargs)
        made.append(weakref.ref(stream))

    monkeypatch.setattr(AllocStream, "__init__", tracked_init)
    return made


def _alive(made: list[weakref.ref[AllocStream]], collect: bool) -> list[AllocStream]:
    """The tracked streams alive; with ``collect``, after a full garbage collection (without it, the streams
    that only a garbage cycle holds are counted alive too: at least as many as after one)."""
    if collect:
        gc.collect()
    return [stream for ref in made if (stream := ref()) is not None]


def _events_alive_within(made: list[weakref.ref[AllocStream]], budget: int) -> bool:
    """Whether the tracked streams alive after a full garbage collection hold at most ``budget`` events (the
    collection, whose cost grows with the heap, runs only where the count before it is over)."""
    return any(sum(len(s) for s in _alive(made, collect)) <= budget for collect in (False, True))


def test_the_weighed_cache_keeps_the_latest_used_within_its_budget() -> None:
    cache: WeighedCache[str, tuple[int, ...]] = WeighedCache(10, len)
    cache.put("a", (1,) * 4)
    cache.put("b", (1,) * 4)
    assert cache.get("a") == (1,) * 4  # now the most recently used
    cache.put("c", (1,) * 4)  # 12 > 10: the least recently used ("b") goes
    assert cache.get("b") is None and cache.get("a") is not None and cache.get("c") is not None
    assert cache.held == 8 and len(cache) == 2
    cache.put("huge", (1,) * 11)  # heavier than the whole budget: not kept, nothing else dropped
    assert cache.get("huge") is None and cache.held == 8
    cache.put("a", (1,) * 2)  # a new value for a key replaces its weight
    assert cache.held == 6


def test_streams_alive_after_many_jobs_stay_within_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Replaying many different steps keeps at most STREAM_EVENTS_KEPT events of streams alive (the replay
    results are kept without their streams), and a step replayed again after its stream was dropped gives the
    same figures."""
    steps = [_step(micro_batch, seq_len) for micro_batch in (1, 2, 3) for seq_len in (128, 256)]
    budget = 2 * len(replayed.stream_of(steps[0], "never"))  # room for about two streams of these steps
    monkeypatch.setattr(replayed, "_STREAMS", WeighedCache(budget, len))
    monkeypatch.setattr(replayed, "_SEEN", WeighedCache(replayed.STEPS_SEEN, lambda _: 1))
    monkeypatch.setattr(replayed, "_REPLAYS", WeighedCache(replayed.REPLAY_PHASES_KEPT, lambda r: len(r.phases)))
    made = _track_new_streams(monkeypatch)  # the streams other tests' caches (set aside above) hold are not counted
    first: list[StepReplayed] = []
    for step in steps:
        for allocator in ("default", "expandable-segments"):
            first.append(replay_step(step, "after-phase", allocator, COEF, device_bytes=2**40))
        assert _events_alive_within(made, budget)
    replayed._STREAMS.clear()
    replayed._SEEN.clear()
    replayed._REPLAYS.clear()
    again = [
        replay_step(step, "after-phase", allocator, COEF, device_bytes=2**40)
        for step in steps
        for allocator in ("default", "expandable-segments")
    ]
    assert again == first


def test_kept_replays_hold_no_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the streams kept for rebuilding are dropped, none of the streams built for the replays stays alive:
    the replays of many jobs are kept as their results (before issue 45 an lru_cache keyed on the stream kept
    up to 2048 streams alive, ~10 GB for the prediction snapshot's PPO matrix)."""
    made = _track_new_streams(monkeypatch)
    for micro_batch in (1, 2):
        for seq_len in (128, 192):
            replay_step(_step(micro_batch, seq_len), "never", "default", COEF)
    assert _alive(made, collect=True)  # built and kept for the next replay
    replayed._STREAMS.clear()
    assert not _alive(made, collect=False) or not _alive(made, collect=True)
