"""Where torch's caching allocator gets the cuBLAS workspaces: at the first matrix product of each thread.

torch keeps one cuBLAS workspace per handle and stream (``aten/src/ATen/cuda/CublasHandlePool.cpp``), made
through the caching allocator at the handle's first product and kept for the run. The training process has two
such handles: the main thread's, whose first product is the first forward's first layer, and the autograd
engine's device thread's, which runs every backward and whose first product is the head's weight gradient, the
first gradient a backward makes. Every probe's allocator history on the H200 shows both, 32 MiB each, never freed
(``benchmarks/results/cuda_history_gap.md``). Where they land matters to reserved memory: made late, a
workspace splits a large free block that a later request then cannot use.

The stream builder (:mod:`search.streams.build`) makes the model's resident buffers at setup, the first
workspace among them; :func:`place_workspaces` moves that one to the first allocation of the first step's first
phase and makes the backward's right after the first gradient of its first backward phase.
"""

from __future__ import annotations

from search.coefficients import Coefficients
from store.alloc_stream import ALLOC, KIND_INDEX, PHASE, AllocStream, Event

__all__ = ["BACKWARD_PHASES", "BACKWARD_WORKSPACE", "backward_workspace", "place_workspaces"]

BACKWARD_WORKSPACE = "backward_workspace"  # the resident part of the backward's own workspace

BACKWARD_PHASES = frozenset({"backward", "actor_training", "critic_training"})
_BUFFERS, _GRADIENTS = KIND_INDEX["buffers"], KIND_INDEX["gradients"]


def backward_workspace(coef: Coefficients) -> dict[str, int]:
    """The resident part of the autograd thread's workspace: ``cublas_workspace_bytes`` beside the forward's
    (counted in the model's buffers), ``{}`` where there is none (the CPU backend)."""
    nbytes = int(coef.cublas_workspace_bytes)
    return {BACKWARD_WORKSPACE: nbytes} if nbytes else {}


def place_workspaces(stream: AllocStream, workspace: int, step_mark: str) -> AllocStream:
    """``stream`` with its setup's ``workspace``-byte buffer made at the first step's first allocation instead,
    and a second one right after the first gradient of the first step's first backward phase (both kept). A
    stream without a setup workspace (the CPU backend: ``workspace`` 0) is returned as it is."""
    if workspace <= 0:
        return stream
    events: list[Event] = []
    key = max([e[1] for e in stream.events if e[0] == ALLOC], default=0) + 1
    step, phase = 0, "setup"
    moved = forward = backward = False
    events_in = stream.events
    for index, event in enumerate(events_in):
        if forward and backward:  # both placed (so the setup's moved): the rest is kept as it is
            events.extend(events_in[index:])
            break
        op, _, size, _, kind = event
        if op == PHASE:
            name = stream.phases[event[1]]
            if name.startswith(step_mark):
                step = int(name.removeprefix(step_mark))
            else:
                phase = name
        if op == ALLOC and step == 0 and kind == _BUFFERS and size == workspace and not moved:
            moved = True  # made at the first forward instead (below)
            continue
        events.append(event)
        if op != ALLOC or step != 1:
            continue
        if moved and not forward:
            events.append((ALLOC, key, workspace, 0, _BUFFERS))
            key, forward = key + 1, True
        if phase in BACKWARD_PHASES and kind == _GRADIENTS and not backward:
            events.append((ALLOC, key, workspace, 0, _BUFFERS))
            key, backward = key + 1, True
    return AllocStream(tuple(events), stream.phases)
