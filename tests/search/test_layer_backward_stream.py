"""A decoder layer's recompute and backward in the built stream (issue 46): under checkpointing the top layer's
forward runs again inside the backward, its temporaries made and freed as in the forward, and the recompute stops
after its last saved tensor (torch's non-reentrant checkpoint: ``_StopRecomputationError``); the layer's backward
makes each op's input gradient and frees it once read, and the stream holds what is alive at its peak."""

from __future__ import annotations

from search.coefficients import Coefficients
from search.streams.parts import Parts
from search.streams.sizes import (
    BACKWARD_FREED,
    BACKWARD_MADE,
    FORWARD_FREED,
    FORWARD_MADE,
    RECOMPUTE_FREED,
    RECOMPUTE_MADE,
    layer_backward_program,
    recompute_program,
)
from store.alloc_stream import ALLOC, FREE, StreamBuilder
from store.models import get_model

COEF = Coefficients()
MiB = 2**20


def _after_the_forward(sizes: dict[str, tuple[int, ...]]) -> tuple[StreamBuilder, Parts, int]:
    """A part of activations holding 7 bytes (the layers' checkpoints, in a pattern of 7), and the index of the
    stream's next event."""
    out = StreamBuilder()
    parts = Parts(out)
    parts.move({"activations": 7}, {"activations": (7,)})
    return out, parts, len(out.build().events)


def _events_since(out: StreamBuilder, start: int) -> list[tuple[int, int]]:
    return [(op, size) for op, _, size, _, _ in out.build().events[start:]]


def test_the_recompute_stops_after_its_last_saved_tensor() -> None:
    """Forward (4 saved, 2 freed after the fourth tensor, 3 saved, 5 freed at once): the recompute makes the
    first three, and the 2 still alive when it stops is freed then; the 5 after the last saved is never made;
    the moment's bytes beyond come in the part's pattern."""
    forward = ((FORWARD_MADE, (4, 2, 3, 5)), (FORWARD_FREED, (0, 4, 0, 4)))
    program = dict(recompute_program(forward))
    assert program == {RECOMPUTE_MADE: (4, 2, 3), RECOMPUTE_FREED: (0, 4, 0)}
    out, parts, start = _after_the_forward({})
    parts.move({"activations": 7 + 4 + 2 + 3}, {"activations": (7,), **program})
    assert _events_since(out, start) == [(ALLOC, 4), (ALLOC, 2), (ALLOC, 3), (FREE, 0), (ALLOC, 2)]
    assert parts.bytes("activations") == 16


def test_a_program_never_holds_more_than_the_moment_counts() -> None:
    """The part holds at most the moment's bytes while a program runs (the cost model's peak is the stream's):
    with room for 4 + 2 + 1 only, the recompute's last saved tensor is cut to 1; a backward's temporary that
    would not fit is not made, and the program stops there."""
    forward = ((FORWARD_MADE, (4, 2, 3, 5)), (FORWARD_FREED, (0, 4, 0, 4)))
    out, parts, start = _after_the_forward({})
    parts.move({"activations": 7 + 4 + 3}, {"activations": (7,), **dict(recompute_program(forward))})
    assert _events_since(out, start) == [(ALLOC, 4), (ALLOC, 2), (ALLOC, 1), (FREE, 0), (ALLOC, 2)]
    out, parts, start = _after_the_forward({})
    backward = {BACKWARD_MADE: (4, 6, 2, 3), BACKWARD_FREED: (2, 3, 0, 4)}
    parts.move({"activations": 7 + 5}, {"activations": (7,), **backward})
    assert _events_since(out, start) == [(ALLOC, 4), (ALLOC, 1)]
    assert parts.bytes("activations") == 12


def test_a_layer_backward_holds_what_is_alive_at_its_peak() -> None:
    """Backward (4 freed after the second tensor, 6 after the third, 2 handed on, 3 freed at once): its own
    tensors peak at 10 once the 6 is made; the stream stops there and holds both, then reaches the moment's
    bytes in the part's pattern."""
    program = {BACKWARD_MADE: (4, 6, 2, 3), BACKWARD_FREED: (2, 3, 0, 4)}
    out, parts, start = _after_the_forward({})
    parts.move({"activations": 7 + 10}, {"activations": (7,), **program})
    assert _events_since(out, start) == [(ALLOC, 4), (ALLOC, 6)]
    out, parts, start = _after_the_forward({})
    parts.move({"activations": 7 + 12}, {"activations": (7,), **program})
    assert _events_since(out, start) == [(ALLOC, 4), (ALLOC, 6), (ALLOC, 2)]


def test_a_forward_from_nothing_runs_no_backward_program() -> None:
    """The programs run only where a backward grows what the forward left: a part grown from nothing (a
    checkpointed forward) takes its pattern."""
    out = StreamBuilder()
    parts = Parts(out)
    parts.move({"activations": 14}, {"activations": (7,), BACKWARD_MADE: (4, 6), BACKWARD_FREED: (2, 0)})
    assert _events_since(out, 0) == [(ALLOC, 7), (ALLOC, 7)]


def test_opt_layer_backward_makes_the_mlp_gradients_at_its_width() -> None:
    """opt-1.3b at 8 x 1024 (the catalog's trace): the backward makes two b x s x ffn tensors, fc2's input
    gradient and the ReLU's backward, each freed once the next op has read it, and hands one b x s x h gradient
    to the layer below; no weight's gradient is among them."""
    program = dict(layer_backward_program(get_model("opt-1.3b"), 8, 1024, "bf16", "sdpa"))
    made, freed = program[BACKWARD_MADE], program[BACKWARD_FREED]
    wide = [i for i, size in enumerate(made) if size == 8 * 1024 * 8192 * 2]
    assert len(wide) == 2 and all(freed[i] == i + 2 for i in wide)  # freed after the next tensor is made
    assert [size for size, order in zip(made, freed, strict=True) if order == 0] == [32 * MiB]
    assert 2048 * 2048 * 2 not in made  # q, k, v and out_proj's weight gradients stay the cost model's gradients
