"""Activation terms of a hybrid model: linear-attention layers between full-attention ones (Qwen3-Next).

A hybrid config's ``layer_types`` mixes ``"linear_attention"`` (Gated DeltaNet) layers with ``"full_attention"``
ones (Qwen3-Next: every ``full_attention_interval``-th layer is full attention). The two kinds keep different
tensors, so no one layer stands for every layer, and a cut of the first two layers holds linear-attention layers
only, which transformers' cache refuses. The cut keeps one layer of each kind
(:func:`probes.trace.hybrid_cut.hybrid_cut`), each is traced (``trace_step(..., every_layer=True)``) and the kinds
are combined into one term set, so that the cost model's ``num_layers x layer_saved + outside_saved`` and its
per-layer windows stay as they are:

- ``layer_saved``: one size per kind, its layer's saved bytes x its count of layers in the full config's
  ``layer_types`` / ``num_layers``: ``num_layers`` times their sum is every layer's (to a byte per layer of
  rounding);
- ``outside_saved``: what the cut keeps beyond its layers' own saved bytes;
- ``layer_forward`` and ``layer_backward``: a layer's transient peak is the larger kind's: each layer's window (its
  peak, then down to what it leaves), the first brought back to zero before the next, so the window's peak is the
  larger of the two at every shape;
- the other windows (LM head and loss, the no-grad forward) as their peak and what they leave.

Which Gated DeltaNet code runs is transformers' choice (``use_kernel_func_from_hub_with_fallback``): the fused
kernels of flash-linear-attention (``fla``) where that package is installed, otherwise the torch fallback
``torch_chunk_gated_delta_rule``, which is what the meta device traces here without ``fla`` (``terms["hybrid"]``
says which, and the plan's stated reason repeats it). The fallback pads the sequence to whole chunks of
``chunk_size`` (64) tokens and loops over the chunks, making tensors per chunk: its bytes are a polynomial of the
shape only at whole chunks (of three chunks or more), so a hybrid is fitted at tokens that are multiples of the
chunk (:func:`hybrid_points`) and is exact there; between them the padded chunk's bytes are interpolated. On CUDA
with ``fla`` installed the saved tensors differ (fla's kernels do not keep the fallback's fp32 per-chunk tensors).
"""

from __future__ import annotations

import importlib.util
import inspect
from typing import Any

from probes.trace.activations import CHECK_SHAPE, FIT_SHAPES, StepTrace, fit_terms, trace_step
from probes.trace.hybrid_cut import LINEAR
from store.activation_terms import WINDOWS


def linear_attention_code() -> str:
    """Which Gated DeltaNet code transformers runs here: flash-linear-attention's kernels or its torch fallback."""
    if importlib.util.find_spec("fla") is not None:
        return "flash-linear-attention (fla) kernels"
    return "transformers' torch fallback (torch_chunk_gated_delta_rule; flash-linear-attention not installed)"


def chunk_tokens() -> int:
    """The tokens per chunk of transformers' torch Gated DeltaNet (``torch_chunk_gated_delta_rule``'s default)."""
    from transformers.models.qwen3_next import modeling_qwen3_next

    default = inspect.signature(modeling_qwen3_next.torch_chunk_gated_delta_rule).parameters["chunk_size"].default
    return int(default)


def hybrid_points() -> tuple[tuple[tuple[int, int, int], ...], tuple[int, int, int]]:
    """The fit's shapes and check shape at whole chunks: ``FIT_SHAPES`` and ``CHECK_SHAPE`` with their distinct
    token counts (64, 96, 128; 160) taken to 3, 4, 5 (6) chunks. From the third chunk on each chunk adds the
    same bytes; the first two differ by a few rows (the recurrent state starts at zeros; the no-grad forward's
    peak falls elsewhere), tens of KB at the width of the tests, which the fit does not follow."""
    chunk = chunk_tokens()
    order = {s: i + FIRST_CHUNKS for i, s in enumerate(sorted({s for _, s in FIT_SHAPES}))}
    points = tuple((b, order[s] * chunk, 0) for b, s in FIT_SHAPES)
    return points, (CHECK_SHAPE[0], (len(order) + FIRST_CHUNKS) * chunk, 0)


FIRST_CHUNKS = 3  # the fewest chunks of the fit: from there on every chunk adds the same bytes


def _peak_left(window: tuple[int, ...]) -> tuple[int, int]:
    """A window's peak above its start (0 at least) and what it leaves."""
    live = peak = 0
    for change in window:
        live += change
        peak = max(peak, live)
    return peak, live


def _combined(trace: StepTrace, counts: tuple[int, ...]) -> StepTrace:
    """One shape's trace of a hybrid cut as the combined term set of the module docstring (integers: the saved
    sizes are divided by the layer count after the fit)."""
    summary = {name: _peak_left(window) for name, window in trace.windows.items()}
    windows: dict[str, tuple[int, ...]] = {name: (peak, left - peak) for name, (peak, left) in summary.items()}
    for name in ("layer_forward", "layer_backward"):
        changes: list[int] = []
        for _, forward, backward in trace.layers:
            peak, left = _peak_left(forward if name == "layer_forward" else backward)
            changes += [-sum(changes), peak, left - peak] if changes else [peak, left - peak]
        windows[name] = tuple(changes)
    total = trace.outside_saved + 2 * sum(trace.layer_saved)  # what _read's outside is taken from
    return StepTrace(
        layer_saved=tuple(count * layer[0] for count, layer in zip(counts, trace.layers, strict=True)),
        outside_saved=total - sum(layer[0] for layer in trace.layers),
        windows={name: windows[name] for name in (*WINDOWS, *(w for w in windows if w not in WINDOWS))},
    )


def trace_hybrid_terms(model: Any, kinds: dict[str, int]) -> dict[str, Any]:
    """The combined terms of a hybrid's cut ``model`` (one layer of each kind, in ``kinds``' order), traced at
    whole chunks (inside the trace's kernel routing)."""
    points, check_point = hybrid_points()
    counts = tuple(kinds.values())
    traces = [_combined(trace_step(model, b, s, every_layer=True), counts) for b, s, _ in points]
    check = _combined(trace_step(model, *check_point[:2], every_layer=True), counts)
    terms = fit_terms(traces, check, points, check_point)
    layers = sum(counts)
    terms["layer_saved"] = [[_exact(c / layers) for c in poly] for poly in terms["layer_saved"]]
    terms["hybrid"] = {"layers": dict(kinds), LINEAR: linear_attention_code()}
    return terms


def _exact(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value
