"""The tensors a decoder layer's backward makes, in order, and when each is freed (``layer_backward_tensors`` of
the traced terms, :mod:`store.activation_terms`): traced on the meta device with the layer's forward
(:mod:`probes.trace.layer_forward`, the same one forward with labels and without a KV cache, then its backward),
fitted over the same shapes. The stream builder runs them at the top layer's backward (:mod:`search.streams.parts`).

What autograd makes there is each op's input gradient (torch's ``derivatives.yaml`` formulas: a linear's
``grad.mm(weight)``, the ReLU's ``threshold_backward``, the fused dropout's ``native_dropout_backward``, the flash
kernel's ``_scaled_dot_product_flash_attention_backward`` with its dq, dk and dv, the layer norm's
``native_layer_norm_backward``) and the sums where a tensor feeds two ops (the residual's: autograd's
``InputBuffer::accumulate``), each freed once the op that reads it has run; and each weight's gradient, which
lives to the optimizer step (the cost model's gradients, not listed here)."""

from __future__ import annotations

from typing import Any

from probes.trace.activations import CHECK_SHAPE, FIT_SHAPES
from probes.trace.layer_forward import LayerForward, _trace_forward, fit_layer_forward
from store.alloc_stream import ALLOC, FREE


def _made_and_freed(stream: Any, first: int, last: int, end: int) -> LayerForward:
    """Each tensor made between events ``first`` and ``last`` (a layer's backward) and freed before event
    ``end`` (the backward's end: a weight's gradient lives on, and is not listed), in order: its bytes and the
    index (among those listed) of the last one made before it is freed, or -1 where it outlives ``last`` (the
    input gradient handed to the layer below). Frees of tensors made before ``first`` (the saved ones the
    backward consumes) are not the window's own."""
    made: list[tuple[int, int]] = []  # (event index, bytes)
    freed_at: dict[int, int] = {}  # event index of an allocation -> event index of its free
    open_keys: dict[int, int] = {}
    for i, (op, key, size, _, _) in enumerate(stream.events):
        if i >= end:
            break
        if op == ALLOC and first < i < last:
            open_keys[key] = i
            made.append((i, size))
        elif op == FREE and key in open_keys:
            freed_at[open_keys.pop(key)] = i
    listed = [(i, size) for i, size in made if i in freed_at]
    out = []
    for i, size in listed:
        free = freed_at[i]
        before = sum(1 for j, _ in listed if j < free) - 1
        out.append((size, before if free < last else -1))
    return tuple(out)


def trace_layer_backward_tensors(model: Any, sequences: int, tokens: int) -> LayerForward:
    """The tensors the second decoder layer of a two-layer ``model`` makes in its backward (not the weights'
    gradients), in order: (bytes, index of the last of them made before it is freed; -1 for the gradient it
    hands to the layer below)."""
    stream, at = _trace_forward(model, sequences, tokens, backward=True)
    return _made_and_freed(stream, at["layer1.bwd"], at["layer1.bwd.end"], at["bwd.end"])


def layer_backward_terms(model: Any) -> dict[str, Any] | None:
    """The ``layer_backward_tensors`` term of a two-layer ``model`` (under
    :func:`probes.trace.activations.gpu_kernels`): traced at the fit's shapes and checked on ``CHECK_SHAPE``
    (:func:`probes.trace.layer_forward.fit_layer_forward`: the same order of frees at every shape, sizes fitted
    exactly; else None, and the stream grows the layer's backward in its saved tensors' sizes)."""
    traced = [trace_layer_backward_tensors(model, b, s) for b, s in (*FIT_SHAPES, CHECK_SHAPE)]
    return fit_layer_forward(traced[:-1], traced[-1])
