"""Every traced term of a model config: the training step's activations (:mod:`probes.trace.activations`),
generation and scoring (:mod:`probes.trace.generation`) and the variants of the training code
(:mod:`probes.trace.variants`), as the catalog and the model shapes keep them."""

from __future__ import annotations

from typing import Any

from probes.trace.activations import (
    CHECK_SHAPE,
    FIT_SHAPES,
    cut_model,
    fit_terms,
    gpu_kernels,
    trace_step,
)
from probes.trace.generation import trace_generation_terms
from probes.trace.hybrid import trace_hybrid_terms
from probes.trace.hybrid_cut import layer_kinds
from probes.trace.layer_backward import layer_backward_terms
from probes.trace.layer_forward import layer_forward_terms
from probes.trace.variants import trace_variants
from store.activation_terms import LAYER_FORWARD_TENSORS, TRACED_KEYS, TRACED_SETTINGS, VARIANTS


def trace_all_terms(hf_config: dict[str, Any], keys: tuple[str, ...] = TRACED_KEYS) -> dict[str, Any]:
    """The terms of every traced setting (``store.activation_terms.TRACED_KEYS``); a setting that cannot be
    traced on the meta device (an op without a meta kernel there: MoE grouped GEMMs take 16-bit inputs only)
    or whose fit fails is left out (the cost model then uses its formulas) and named under ``"unfitted"``."""
    out: dict[str, Any] = {}
    for key in keys:
        dtype, attn_impl = TRACED_SETTINGS[key]
        try:
            out[key] = trace_terms(hf_config, dtype, attn_impl, generation=True)
        except Exception as err:  # no meta kernel, no exact fit, no sdpa, model code the meta device cannot run
            first_line = (str(err).splitlines() or [""])[0][:200]
            out.setdefault("unfitted", {})[key] = f"{type(err).__name__}: {first_line}"
    return out


def trace_terms(
    hf_config: dict[str, Any],
    dtype: str,
    attn_impl: str,
    target: str = "cuda",
    generation: bool = False,
    variants: bool = True,
) -> dict[str, Any]:
    """The fitted activation and loss terms of a model config for one dtype and attention implementation, with
    the kernels of ``target`` (``"cuda"``; ``"cpu"`` to compare with a real CPU run, see :func:`gpu_kernels`);
    with ``generation``, the generation and scoring windows too (:mod:`probes.trace.generation`), and the
    variants of the training code (:mod:`probes.trace.variants`) unless ``variants`` is False. A hybrid of
    linear and full attention (Qwen3-Next) traces one layer of each kind and combines them
    (:mod:`probes.trace.hybrid`); its variants are then composed from the full fine-tune's terms."""

    kinds = layer_kinds(hf_config)
    model = cut_model(hf_config, dtype, attn_impl)
    with gpu_kernels(attention=attn_impl != "eager", target=target):
        if kinds is not None:
            terms = trace_hybrid_terms(model, kinds)
        else:
            traces = [trace_step(model, b, s) for b, s in FIT_SHAPES]
            check = trace_step(model, *CHECK_SHAPE)
            terms = fit_terms(traces, check)
            forward = layer_forward_terms(model)  # the layer's temporaries, without a KV cache
            if forward is not None:
                terms[LAYER_FORWARD_TENSORS] = forward
        if generation:  # generation and scoring, as the RLHF probe runs them; formulas for them where that fails
            try:
                terms["windows"].update(trace_generation_terms(model))
            except Exception as err:
                terms["generation_unfitted"] = f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]}"
    if not variants:
        return terms
    if kinds is not None:  # each kind's layer would be traced per variant: not done yet
        why = f"a hybrid of {' and '.join(kinds)} layers: variants are not traced per kind of layer"
        terms["variants"], terms["variants_unfitted"] = {}, dict.fromkeys(VARIANTS, why)
        return terms
    traced, unfitted = trace_variants(hf_config, dtype, attn_impl, target)
    terms["variants"] = traced
    if unfitted:
        terms["variants_unfitted"] = unfitted
    return terms


def trace_layer_forward(hf_config: dict[str, Any], dtype: str, attn_impl: str) -> dict[str, Any] | None:
    """Only the ``layer_forward_tensors`` term of a model config (what :func:`trace_terms` adds to a full trace):
    for a catalog traced before the term existed. None for a hybrid (traced per kind of layer) or where the
    layer's order of frees differs between shapes."""
    if layer_kinds(hf_config) is not None:
        return None
    model = cut_model(hf_config, dtype, attn_impl)
    with gpu_kernels(attention=attn_impl != "eager"):
        return layer_forward_terms(model)


def trace_layer_backward(hf_config: dict[str, Any], dtype: str, attn_impl: str) -> dict[str, Any] | None:
    """The ``layer_backward_tensors`` term of a model config (the catalog's: ``python -m probes.trace.catalog
    --write-catalog`` adds it to each traced setting; :func:`trace_terms` does not, so a model traced into the
    store's cache has none and its stream grows the layer's backward in its saved tensors' sizes). None for a
    hybrid (traced per kind of layer) or where the layer backward's order of frees differs between shapes."""
    if layer_kinds(hf_config) is not None:
        return None
    model = cut_model(hf_config, dtype, attn_impl)
    with gpu_kernels(attention=attn_impl != "eager"):
        return layer_backward_terms(model)
