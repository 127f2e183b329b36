"""Activation and loss bytes of a training step, traced from the model's own code on the meta device.

The model is cut to two decoder layers and built on the meta device (no weights, no compute, any size); one
forward with labels (the loss inside the model, as HF Trainer and TRL call it) and one backward run under the
live-tensor tracker of :mod:`probes.measure.tracker` counting meta storages, with markers from module hooks. From the
recorded stream come, per traced shape:

- the tensors the second decoder layer's forward makes and that are still alive when the decoder ends (what
  a layer saves for backward), in the order they were made, and that layer's transient peaks in its forward
  and in its backward;
- what is saved outside the layers (embedding output, masks, rotary tables, the final norm's input);
- the LM head and loss: their forward peak above the decoder's end, what they hold into the backward, and the
  backward's peak until the gradient reaches the decoder layers.

Each size is fitted exactly as ``c0 + c1 b + c2 s + c3 b s + c4 s^2 + c5 b s^2`` from six shapes (b sequences of
s tokens; the label shift pads one token per sequence, the eager causal mask is s x s) and checked on a
seventh one not used for the fit (:func:`trace_terms`). Attention: ``eager`` runs transformers' eager code as is;
``sdpa`` (and ``flash_attention_2``, whose kernel keeps the same tensors) routes
``torch.nn.functional.scaled_dot_product_attention`` to the CUDA flash kernel's aten op (16-bit, no mask)
or memory-efficient one (fp32 or with a mask), whose meta functions and autograd formulas say what the GPU
kernel allocates and saves; on the meta device the dispatcher would otherwise pick the math fallback that
materialises the scores, which no GPU run does.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from functools import cache
from typing import Any

from probes.model.sequences import unpacked_sequences
from store.activation_terms import Polynomial, basis, compact, evaluate
from store.alloc_stream import ALLOC, FREE, PHASE

# (sequences, tokens) of the fit: six shapes for the six terms 1, b, s, b*s, s^2, b*s^2 (b >= 2: at b = 1 some
# reshapes are views and the step makes fewer tensors), and one more where the fit must hold exactly.
FIT_SHAPES: tuple[tuple[int, int], ...] = ((2, 64), (3, 64), (2, 96), (4, 96), (2, 128), (4, 128))
# A multiple of 32 tokens: the memory-efficient kernel (fp32 sdpa) pads its log-sum-exp to 32 rows, which
# no polynomial follows between multiples (at most 32 rows per head of fp32 more than the fit says there).
CHECK_SHAPE: tuple[int, int] = (3, 160)
TRACED_LAYERS = 2


@dataclass(frozen=True)
class StepTrace:
    """Bytes of one traced forward and backward at one (sequences, tokens) shape.

    A window is the ordered list of changes of live bytes (+ an allocation, - a free) between two markers:
    ``layer_forward`` and ``layer_backward`` of the second decoder layer, ``head_forward`` from the decoder's
    end (the LM head's input) until the forward returns the loss, ``head_backward`` from the backward's start
    until the gradient reaches the decoder layers, and ``inference_forward`` from the start of a no-grad
    forward until its LM head (what a scoring pass holds through its layers).
    """

    layer_saved: tuple[int, ...]  # the second layer's forward tensors alive when the decoder ends, in order
    outside_saved: int  # alive when the decoder ends, made outside the layers (embeddings, masks, final norm)
    windows: dict[str, tuple[int, ...]]
    # each layer's own (saved bytes, forward window, backward window), where traced with every_layer (hybrids)
    layers: tuple[tuple[int, tuple[int, ...], tuple[int, ...]], ...] = ()


@contextlib.contextmanager
def gpu_kernels(attention: bool = True, target: str = "cuda") -> Iterator[None]:
    """Route ``F.scaled_dot_product_attention`` to the aten op of the CUDA kernel a GPU would pick, and
    ``F.dropout`` to the fused kernel CUDA runs (ATen's ``dropout`` takes it only for CUDA inputs).
    ``target="cpu"`` picks the CPU's flash kernel instead, so that a real CPU run can check a meta trace."""
    import torch
    import torch.nn.functional as functional

    original = functional.scaled_dot_product_attention

    def routed(q: Any, k: Any, v: Any, attn_mask: Any = None, dropout_p: float = 0.0, is_causal: bool = False,
               scale: float | None = None, enable_gqa: bool = False) -> Any:  # fmt: skip
        flash = attn_mask is None and q.dtype in (torch.float16, torch.bfloat16) and q.shape[-1] == v.shape[-1] <= 256
        # grouped-query attention: CUDA's flash kernel takes the K and V heads as they are when asked to
        # (enable_gqa: transformers' sdpa_attention_forward asks when there is no mask, use_gqa_in_sdpa; torch's
        # sdp_utils.cpp admits it for flash only, check_batch_size_and_num_heads_dense<true>); every other kernel
        # gets every query head's K and V (the math fallback's pre_process_group_query_attention_input)
        if k.shape[1] != q.shape[1] and not (enable_gqa and flash and target != "cpu"):
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
            v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        if target == "cpu":  # the CPU's flash kernel, which keeps what CUDA's does (but the RNG seeds)
            out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q, k, v, dropout_p, is_causal, attn_mask=attn_mask, scale=scale
            )
        elif flash:
            out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal, scale=scale)
        else:
            out = torch.ops.aten._scaled_dot_product_efficient_attention(
                q, k, v, attn_mask, True, dropout_p, is_causal, scale=scale
            )
        return out[0]

    def dropout(input: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
        if training and 0 < p < 1:  # CUDA's fused kernel: a one-byte mask, not a noise tensor of the input's type
            return torch.ops.aten.native_dropout(input, p, True)[0]
        return original_dropout(input, p, training, inplace)

    original_dropout = functional.dropout
    if attention:
        functional.scaled_dot_product_attention = routed  # type: ignore[assignment]
    functional.dropout = dropout
    try:
        yield
    finally:
        functional.scaled_dot_product_attention = original
        functional.dropout = original_dropout


def _representative(hf_config: dict[str, Any]) -> dict[str, Any]:
    """``hf_config`` with its traced layer (the second) of the kind most of its layers are: DeepSeek's MLA
    models (``deepseek_v2``, ``deepseek_v3``) keep their first ``first_k_dense_replace`` layers dense and route
    the rest through experts, so the cut keeps one dense layer and traces an MoE one. A hybrid of linear and
    full attention (Qwen3-Next) keeps one layer of each kind (:func:`probes.trace.hybrid_cut.hybrid_cut`)."""
    from probes.trace.hybrid_cut import hybrid_cut

    hybrid = hybrid_cut(hf_config, TRACED_LAYERS)
    if hybrid is not None:
        return hybrid
    dense = hf_config.get("first_k_dense_replace")
    layers = hf_config.get("num_hidden_layers")
    if isinstance(dense, int) and isinstance(layers, int) and 1 < dense < layers - dense:
        return {**hf_config, "first_k_dense_replace": 1}
    return hf_config


def cut_model(hf_config: dict[str, Any], dtype: str, attn_impl: str, device: str = "meta") -> Any:
    """The model of ``hf_config`` cut to two decoder layers, in training mode, on ``device`` (random weights
    off the meta device)."""
    import torch
    from transformers import AutoModelForCausalLM

    from probes.model.shape import config_object
    from store.models import cut_config

    config = config_object(
        cut_config(_representative(hf_config), str(hf_config.get("model_type")), TRACED_LAYERS), "trace"
    )
    config._attn_implementation = "eager" if attn_impl == "eager" else "sdpa"
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(copy.deepcopy(config), dtype=torch_dtype)
    model.train()
    return model


def trace_step(
    model: Any, sequences: int, tokens: int, *, checkpointed: bool = False, every_layer: bool = False
) -> StepTrace:
    """Trace one forward (with labels) and backward of a two-layer ``model`` at one shape, on the device its
    parameters are on (the meta device; a real CPU run is traced the same way to check the meta trace).

    ``checkpointed``: the model runs HF's gradient checkpointing. A checkpointed layer keeps its output as
    the next layer's checkpoint, so the layer that stands for every layer but the last is the first one
    (otherwise the second: its input comes from a layer, as every layer's but the first). It traces the
    no-grad forward too (the ``inference_forward`` window), and an RLHF actor's training pass: the model
    output's token log-probs as the probe takes them (:func:`probes.model.logprobs.token_logprobs`, the fp32
    log-softmax of the shifted logits, gathered) and a backward of their mean (the policy loss's per-token
    arithmetic, over b x s elements, is not counted), the ``policy_head_forward`` and ``policy_head_backward``
    windows. ``every_layer``: each layer's saved bytes and windows too (``StepTrace.layers``, for hybrids)."""
    import torch

    from probes.measure.meta_results import run_meta_op
    from probes.measure.tracker import LiveTensorTracker
    from probes.model.logprobs import token_logprobs
    from probes.model.shape import decoder_layers

    _, layers = decoder_layers(model, TRACED_LAYERS)
    device = next(model.parameters()).device
    run_op = run_meta_op if device.type == "meta" else None  # a meta op's result is described once per signature
    tracker = LiveTensorTracker(device_types=(device.type,), record_stream=True, run_op=run_op)

    def marker(name: str) -> Any:
        return lambda *args: tracker.mark_phase(name) and None

    handles = []
    for index, layer in enumerate(layers):
        handles.append(layer.register_forward_pre_hook(marker(f"layer{index}.fwd")))
        handles.append(layer.register_forward_hook(marker(f"layer{index}.fwd.end")))
    backward = ["layers.bwd"]  # the marker of the gradient reaching the layers: the SFT loss's, then the policy's
    handles.append(layers[-1].register_full_backward_pre_hook(lambda *args: marker(backward[0])()))
    handles.append(layers[1].register_full_backward_hook(marker("layer1.bwd.end")))
    for index, layer in enumerate(layers if every_layer else ()):  # each layer's backward, not only the second's
        handles.append(layer.register_full_backward_pre_hook(marker(f"layer{index}.bwd")))
        if index != 1:
            handles.append(layer.register_full_backward_hook(marker(f"layer{index}.bwd.end")))
    stage = ["head"]  # the LM head's marker: the training forward's, then the no-grad forward's
    handles.append(model.get_output_embeddings().register_forward_pre_hook(lambda *args: marker(stage[0])()))
    ids = torch.zeros((sequences, tokens), dtype=torch.long, device=device)
    try:
        with tracker, unpacked_sequences():
            tracker.track_existing(model.parameters())  # weights are there before the step: not its allocations
            tracker.mark_phase("start")
            loss = model(input_ids=ids, labels=ids).loss
            tracker.mark_phase("fwd.end")
            loss.backward()
            tracker.mark_phase("bwd.end")
            del loss
            # a scoring pass (reference, reward, critic, old log-probs): no grad, no KV cache kept
            stage[0] = "inference.head"
            tracker.mark_phase("inference.start")
            with torch.no_grad():
                model(input_ids=ids, use_cache=False)
            tracker.mark_phase("inference.end")
            for param in model.parameters():  # the actor's first micro-step: no gradients yet
                param.grad = None
            stage[0], backward[0] = "policy.head", "policy.layers.bwd"
            logprobs = token_logprobs(model(input_ids=ids, use_cache=False).logits, ids)
            loss = -logprobs.mean()
            del logprobs
            tracker.mark_phase("policy.fwd.end")
            loss.backward()
            tracker.mark_phase("policy.bwd.end")
            del loss
    finally:
        for handle in handles:
            handle.remove()
        for param in model.parameters():
            param.grad = None
    return _read(tracker.stream(), layer=0 if checkpointed else 1)


def _read(stream: Any, layer: int = 1) -> StepTrace:
    """The StepTrace of a recorded stream: live bytes walked event by event, windows cut at the markers."""
    live, live_after, deltas = 0, [], []
    index_at: dict[str, int] = {}
    sizes: dict[int, int] = {}
    made_at: dict[int, int] = {}
    freed_at: dict[int, int] = {}
    for i, (op, key, size, _, _) in enumerate(stream.events):
        delta = 0
        if op == ALLOC:
            sizes[key], made_at[key], delta = size, i, size
        elif op == FREE:
            delta = -sizes.get(key, 0)
            freed_at[key] = i
        elif op == PHASE:
            index_at.setdefault(stream.phases[key], i)  # the first time a marker fires
        live += delta
        live_after.append(live)
        deltas.append(delta)
    at = {name: live_after[i] for name, i in index_at.items()}

    def window(first: str, last: str, leaving: bool = True, until: str = "bwd.end") -> tuple[int, ...]:
        """The changes between two markers; without ``leaving``, not the allocations still alive at the
        backward's end (``until``: weight gradients, which the cost model counts as gradients)."""
        keep = range(index_at[first], index_at[last])
        if not leaving:
            end = index_at[until]
            kept = {made_at[k] for k in made_at if made_at[k] in keep and not alive_at(k, end)}
            return tuple(deltas[i] for i in keep if deltas[i] < 0 or i in kept)
        return tuple(deltas[i] for i in keep if deltas[i])

    def alive_at(key: int, moment: int) -> bool:
        return made_at[key] < moment < freed_at.get(key, len(stream.events))

    def made_between(first: str, last: str) -> list[int]:
        return sorted((k for k in made_at if index_at[first] < made_at[k] < index_at[last]), key=made_at.__getitem__)

    head = index_at["head"]
    saved = tuple(sizes[k] for k in made_between(f"layer{layer}.fwd", f"layer{layer}.fwd.end") if alive_at(k, head))
    windows = {
        "layer_forward": window("layer1.fwd", "layer1.fwd.end"),
        "layer_backward": window("layers.bwd", "layer1.bwd.end", leaving=False),
        "head_forward": window("head", "fwd.end"),
        "head_backward": window("fwd.end", "layers.bwd", leaving=False),
        "inference_forward": window("inference.start", "inference.head"),
        "policy_head_forward": window("policy.head", "policy.fwd.end"),
        "policy_head_backward": window("policy.fwd.end", "policy.layers.bwd", leaving=False, until="policy.bwd.end"),
    }
    # what the two layers keep beyond twice the standing layer's (the first layer's input or the last one's
    # output kept otherwise) counts as outside: so L layers keep L x layer_saved + outside_saved, exact at two
    per_layer = tuple(
        (
            sum(sizes[k] for k in made_between(f"layer{i}.fwd", f"layer{i}.fwd.end") if alive_at(k, head)),
            window(f"layer{i}.fwd", f"layer{i}.fwd.end"),
            window(f"layer{i}.bwd", f"layer{i}.bwd.end", leaving=False),
        )
        for i in range(TRACED_LAYERS)
        if f"layer{i}.bwd" in index_at
    )
    outside = at["head"] - at["start"] - 2 * sum(saved)
    return StepTrace(layer_saved=saved, outside_saved=outside, windows=windows, layers=per_layer)


class FitError(ValueError):
    """Traced bytes that do not follow one polynomial of ``store.activation_terms.TERM_BASIS`` over the shapes."""


def _solve(values: list[int], points: tuple[tuple[int, ...], ...]) -> list[Fraction]:
    """Exact coefficients with values[i] = sum(c_j * term_j) at points[i], over the first len(points) terms
    of TERM_BASIS: the exact inverse of the points' basis matrix applied to the values, in integers over the
    inverse's common denominator (the same fractions as summing Fraction products, without a Fraction per term:
    a trace solves thousands of these)."""
    rows, denominator = _integer_inverse(points)
    return [Fraction(sum(a * v for a, v in zip(row, values, strict=True)), denominator) for row in rows]


@cache
def _integer_inverse(points: tuple[tuple[int, ...], ...]) -> tuple[tuple[tuple[int, ...], ...], int]:
    """:func:`fit_inverse` of ``points`` as integers over one common denominator: (numerators, denominator)."""
    inverse = fit_inverse(points)
    denominator = math.lcm(*(x.denominator for row in inverse for x in row))
    return tuple(tuple(int(x * denominator) for x in row) for row in inverse), denominator


@cache
def fit_inverse(points: tuple[tuple[int, ...], ...]) -> tuple[tuple[Fraction, ...], ...]:
    """The inverse of the basis matrix of ``points`` (Gauss-Jordan on fractions), once per set of points."""
    n = len(points)
    rows = [[Fraction(t) for t in basis(*point)[:n]] + [Fraction(int(i == j)) for j in range(n)]
            for i, point in enumerate(points)]  # fmt: skip
    for col in range(n):
        pivot = next(r for r in range(col, n) if rows[r][col] != 0)
        rows[col], rows[pivot] = rows[pivot], rows[col]
        rows[col] = [x / rows[col][col] for x in rows[col]]
        for r in range(n):
            if r != col and rows[r][col] != 0:
                rows[r] = [a - rows[r][col] * b for a, b in zip(rows[r], rows[col], strict=True)]
    return tuple(tuple(row[n:]) for row in rows)


FIT_POINTS = tuple((b, s, 0) for b, s in FIT_SHAPES)
CHECK_POINT = (*CHECK_SHAPE, 0)


def _fit(
    name: str,
    traced: list[tuple[int, ...]],
    check: tuple[int, ...],
    points: tuple[tuple[int, ...], ...] = FIT_POINTS,
    check_point: tuple[int, ...] = CHECK_POINT,
) -> list[Polynomial]:
    """Each position of same-length integer lists fitted exactly over ``points`` (sequences, tokens, LoRA
    rank) and checked at ``check_point``."""
    lengths = {len(values) for values in [*traced, check]}
    if len(lengths) != 1:
        raise FitError(f"{name}: the step makes a different number of tensors at different shapes: {sorted(lengths)}")
    fitted = []
    for i, checked in enumerate(check):
        solved = _solve([values[i] for values in traced], points)
        coefficients = [int(c) if c.denominator == 1 else float(c) for c in solved]
        if evaluate(coefficients, *check_point) != checked:
            raise FitError(f"{name}[{i}]: {evaluate(coefficients, *check_point)} fitted, {checked} traced")
        fitted.append(coefficients)
    return fitted


def fit_terms(
    traces: list[StepTrace],
    check: StepTrace,
    points: tuple[tuple[int, ...], ...] = FIT_POINTS,
    check_point: tuple[int, ...] = CHECK_POINT,
) -> dict[str, Any]:
    """The exact fit of every traced size over ``points``, checked on ``check_point``; FitError where it
    fails. The windows are those the traces have."""

    def fit(name: str, traced: list[tuple[int, ...]], checked: tuple[int, ...]) -> list[Polynomial]:
        return _fit(name, traced, checked, points, check_point)

    return {
        "layer_saved": fit("layer_saved", [t.layer_saved for t in traces], check.layer_saved),
        "outside_saved": fit("outside_saved", [(t.outside_saved,) for t in traces], (check.outside_saved,))[0],
        "windows": {w: compact(fit(w, [t.windows[w] for t in traces], check.windows[w])) for w in check.windows},
        "fit_shapes": [list(point) for point in points],
        "check_shape": list(check_point),
    }
