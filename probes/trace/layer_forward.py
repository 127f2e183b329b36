"""The tensors a decoder layer's forward makes, in order, and when each is freed (``layer_forward_tensors`` of the
traced terms, :mod:`store.activation_terms`): traced on the meta device like :mod:`probes.trace.activations`,
one forward with labels and without a KV cache (as memplan's SFT probe calls the model), fitted over the same
shapes. The stream builder makes each layer's temporaries from it (:mod:`search.streams.parts`)."""

from __future__ import annotations

from typing import Any

from probes.model.sequences import unpacked_sequences
from probes.trace.activations import CHECK_SHAPE, FIT_SHAPES, TRACED_LAYERS, FitError, _fit
from store.activation_terms import HELD_OVER_LAYERS
from store.alloc_stream import ALLOC, FREE, PHASE


def _trace_forward(model: Any, sequences: int, tokens: int, backward: bool = False) -> tuple[Any, dict[str, int]]:
    """One forward of a two-layer ``model`` (not checkpointed) with labels and without a KV cache, traced until
    the LM head: the recorded stream and the index of each marker (the first layer's start, the second's start
    and end, the LM head's start). With ``backward``, its backward too (the second layer's backward start and
    end, the backward's end: ``layer1.bwd``, ``layer1.bwd.end``, ``bwd.end``), for
    :mod:`probes.trace.layer_backward`."""
    import torch

    from probes.measure.meta_results import run_meta_op
    from probes.measure.tracker import LiveTensorTracker
    from probes.model.shape import decoder_layers

    _, layers = decoder_layers(model, TRACED_LAYERS)
    device = next(model.parameters()).device
    run_op = run_meta_op if device.type == "meta" else None
    tracker = LiveTensorTracker(device_types=(device.type,), record_stream=True, run_op=run_op)
    handles = [
        layers[0].register_forward_pre_hook(lambda *args: tracker.mark_phase("layer0.fwd") and None),
        layers[1].register_forward_pre_hook(lambda *args: tracker.mark_phase("layer1.fwd") and None),
        layers[1].register_forward_hook(lambda *args: tracker.mark_phase("layer1.fwd.end") and None),
        model.get_output_embeddings().register_forward_pre_hook(lambda *args: tracker.mark_phase("head") and None),
    ]
    if backward:
        handles.append(layers[1].register_full_backward_pre_hook(lambda *a: tracker.mark_phase("layer1.bwd") and None))
        handles.append(layers[1].register_full_backward_hook(lambda *a: tracker.mark_phase("layer1.bwd.end") and None))
    ids = torch.zeros((sequences, tokens), dtype=torch.long, device=device)
    try:
        with tracker, unpacked_sequences():
            tracker.track_existing(model.parameters())
            # as memplan's SFT probe calls it (probes.step.phases_sft): no KV cache, whose torch.cat copies of
            # K and V would free the projections' outputs
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            if backward:
                loss.backward()
                tracker.mark_phase("bwd.end")
            del loss
    finally:
        for handle in handles:
            handle.remove()
        for param in model.parameters():
            param.grad = None
    stream = tracker.stream()
    at = {stream.phases[key]: i for i, (op, key, *_) in reversed(list(enumerate(stream.events))) if op == PHASE}
    return stream, at


def trace_layer_forward_tensors(model: Any, sequences: int, tokens: int) -> tuple[tuple[int, int], ...]:
    """The tensors the second decoder layer of a two-layer ``model`` (not checkpointed) makes in its forward
    in order: (bytes, index of the last of them made before it is freed; -1 for one still alive at the LM head,
    a saved tensor). One forward with labels and without a KV cache, traced until the LM head, no backward."""
    stream, at = _trace_forward(model, sequences, tokens)
    return _made_and_freed(stream, at["layer1.fwd"], at["layer1.fwd.end"], at["head"])


def trace_decoder_held_tensors(model: Any, sequences: int, tokens: int) -> tuple[int, ...]:
    """The bytes of each tensor the decoder's forward makes before its first layer and frees after its last
    layer, before the LM head (in the order made): what the decoder's locals hold over every layer and no
    backward saves. OPT (transformers 5.23 ``modeling_opt.py``, ``OPTDecoder.forward``): ``inputs_embeds`` and
    ``pos_embeds``, b x s x h each, freed when the decoder returns (their sum is the first layer's input), and
    the position ids and their mask; a Llama-style decoder passes its embedding output on as the first layer's
    input (saved) and holds only the rotary cos and sin."""
    stream, at = _trace_forward(model, sequences, tokens)
    return _held_over_layers(stream, at["layer0.fwd"], at["layer1.fwd.end"], at["head"])


def _held_over_layers(stream: Any, first: int, last: int, head: int) -> tuple[int, ...]:
    """Bytes of each tensor made before event ``first`` (the first layer's start) and freed between events
    ``last`` (the last layer's end) and ``head``, in the order made."""
    before: dict[int, int] = {}  # key -> index among the tensors made before the first layer
    sizes: list[int] = []
    held: list[int] = []
    for i, (op, key, size, _, _) in enumerate(stream.events):
        if i >= head:
            break
        if op == ALLOC and i < first:
            before[key] = len(sizes)
            sizes.append(size)
        elif op == FREE and key in before:
            index = before.pop(key)
            if i > last:
                held.append(index)
    return tuple(sizes[index] for index in sorted(held))


def _made_and_freed(stream: Any, first: int, last: int, head: int) -> tuple[tuple[int, int], ...]:
    """Each tensor made between events ``first`` and ``last`` (a layer's forward), in order: its bytes and the
    index (among them) of the last one made before it is freed, or -1 where it is still alive at event ``head``
    (saved for the backward). One freed after ``last`` but before ``head`` counts as freed after the last one
    made; frees of tensors made before ``first`` are not the layer's own."""
    order: dict[int, int] = {}
    made: list[list[int]] = []
    for i, (op, key, size, _, _) in enumerate(stream.events):
        if i >= head:
            break
        if op == ALLOC and first < i < last:
            order[key] = len(made)
            made.append([size, -1])
        elif op == FREE and key in order:
            made[order.pop(key)][1] = len(made) - 1
    return tuple((size, freed) for size, freed in made)


LayerForward = tuple[tuple[int, int], ...]  # (bytes, index of the tensor after which it is freed or -1), in order


def fit_layer_forward(traces: list[LayerForward], check: LayerForward) -> dict[str, Any] | None:
    """A layer's forward tensors (:func:`trace_layer_forward_tensors` at each of ``FIT_SHAPES``, and at
    ``CHECK_SHAPE``) as fitted sizes and the order of their frees, where that order is the same at every shape
    and the sizes fit exactly (else None: the cost model then makes the layer's saved tensors only)."""
    freed = [tuple(f for _, f in t) for t in [*traces, check]]
    if not freed[0] or len(set(freed)) != 1:
        return None
    sizes = [tuple(size for size, _ in t) for t in traces]
    try:
        fitted = _fit("layer_forward_tensors", sizes, tuple(size for size, _ in check))
    except FitError:
        return None
    return {"sizes": fitted, "freed_after": list(freed[0])}


def fit_held_over_layers(traces: list[tuple[int, ...]], check: tuple[int, ...]) -> list[Any] | None:
    """The tensors the decoder holds over its layers (:func:`trace_decoder_held_tensors` at each of
    ``FIT_SHAPES``, and at ``CHECK_SHAPE``) as fitted sizes, where they fit exactly (else None: none made)."""
    try:
        return _fit(HELD_OVER_LAYERS, traces, check) if check else None
    except FitError:
        return None


def layer_forward_terms(model: Any) -> dict[str, Any] | None:
    """The ``layer_forward_tensors`` term of a two-layer ``model`` (under :func:`gpu_kernels`): traced at the
    fit's shapes and checked on ``CHECK_SHAPE`` (:func:`fit_layer_forward`), with the tensors the decoder holds
    over its layers under ``HELD_OVER_LAYERS`` where they fit (:func:`fit_held_over_layers`); one forward traced
    per shape."""
    traced = [_trace_forward(model, b, s) for b, s in (*FIT_SHAPES, CHECK_SHAPE)]
    layers = [_made_and_freed(stream, at["layer1.fwd"], at["layer1.fwd.end"], at["head"]) for stream, at in traced]
    forward = fit_layer_forward(layers[:-1], layers[-1])
    if forward is None:
        return None
    held = [_held_over_layers(stream, at["layer0.fwd"], at["layer1.fwd.end"], at["head"]) for stream, at in traced]
    fitted = fit_held_over_layers(held[:-1], held[-1])
    if fitted:
        forward[HELD_OVER_LAYERS] = fitted
    return forward
