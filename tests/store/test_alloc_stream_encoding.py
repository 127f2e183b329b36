"""Allocation streams as bytes (``store.alloc_stream.encode``/``decode``) and their phase windows
(``store.stream_phases``)."""

from __future__ import annotations

import random
import zlib

import pytest

from store.alloc_stream import ALLOC, AllocStream, StreamBuilder, decode, encode
from store.stream_phases import STEP_MARK, WARMUP_MARK, phase_live_peaks


def built_stream(events: int = 5000, seed: int = 7) -> AllocStream:
    """A random stream: allocations of any size (up to 80 GiB), frees, empty_cache calls and phases."""
    rng = random.Random(seed)
    builder = StreamBuilder()
    live: list[int] = []
    for index in range(events):
        choice = rng.random()
        if choice < 0.5 or not live:
            live.append(builder.alloc(rng.choice([1, 512, 2**20, 80 * 2**30 + 3]), rng.choice(["other", "logits"])))
        elif choice < 0.9:
            builder.free(live.pop(rng.randrange(len(live))))
        elif choice < 0.95:
            builder.empty_cache()
        else:
            builder.phase(rng.choice(["forward", "backward", "génération"]) if index % 2 else STEP_MARK)
    return builder.build()


def test_encode_then_decode_gives_the_same_stream() -> None:
    stream = built_stream()
    data = encode(stream)
    assert decode(data) == stream
    assert len(data) < len(stream) * 8  # a few bytes an event
    assert decode(encode(AllocStream(()))) == AllocStream(())


def test_streams_on_other_cuda_streams_keep_their_stream() -> None:
    stream = AllocStream(((ALLOC, 1, 4096, 3, 6),))
    assert decode(encode(stream)) == stream


@pytest.mark.parametrize(
    "data",
    [b"", b"nope", b"MPAS\x01not zlib", b"MPAS\x01" + zlib.compress(b"\x00" * 3)],
    ids=["empty", "foreign", "not-zlib", "truncated"],
)
def test_bytes_that_are_not_a_stream_are_a_value_error(data: bytes) -> None:
    with pytest.raises(ValueError, match="allocation stream"):
        decode(data)


def test_a_truncated_event_table_is_a_value_error() -> None:
    data = encode(built_stream(50))
    body = zlib.decompress(data[5:])
    with pytest.raises(ValueError, match="corrupt"):
        decode(data[:5] + zlib.compress(body[:-8]))


def test_phase_windows_count_what_was_alive_and_skip_warmup_and_stretches() -> None:
    b = StreamBuilder()
    b.alloc(100)  # alive before any marker
    b.phase("setup")
    b.alloc(1000)  # the weights
    for marker, activation in ((WARMUP_MARK, 5000), (STEP_MARK, 300), (STEP_MARK, 700)):
        b.phase(marker)
        batch = b.alloc(10)  # between phases
        b.phase("forward")
        act = b.alloc(activation)
        b.phase(marker)  # the forward ends
        b.free(batch)
        b.phase("backward")  # opens at 100 + 1000 + activation
        b.free(act)
        grad = b.alloc(50)
        b.phase(marker)
        spike = b.alloc(10_000)  # in the stretch after the last phase: no phase's
        b.free(spike)
        b.free(grad)
    stream = b.build()
    assert phase_live_peaks(stream) == {"setup": 1100, "forward": 1810, "backward": 1800}
    assert phase_live_peaks(stream, measured_only=False)["forward"] == 6110


def test_alloc_run_records_what_alloc_one_by_one_records() -> None:
    """``StreamBuilder.alloc_run`` (the stream builder's run of patterned tensors) hands out the same keys and
    appends the same events as a call of ``alloc`` per size, keys going on after it."""
    sizes = [3, 2**20, 0, 80 * 2**30 + 1]
    one, run = StreamBuilder(), StreamBuilder()
    for builder in (one, run):
        builder.alloc(7, "logits")
    keys = [one.alloc(size, "activations") for size in sizes]
    assert list(run.alloc_run(sizes, "activations")) == keys
    assert one.alloc(5) == run.alloc(5)
    assert run.build() == one.build()
    assert run.build().events[1] == (ALLOC, 2, 3, 0, 6)  # activations is KINDS[6]
