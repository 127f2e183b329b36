"""Every traced term of a model config: the training step's activations (:mod:`probes.trace.activations`),
generation and scoring (:mod:`probes.trace.generation`) and the variants of the training code
(:mod:`probes.trace.variants`), as the catalog and the model shapes keep them."""

from __future__ import annotations

from typing import Any

from probes.trace.activations import CHECK_SHAPE, FIT_SHAPES, cut_model, fit_terms, gpu_kernels, trace_step
from probes.trace.generation import trace_generation_terms
from probes.trace.variants import trace_variants
from store.activation_terms import TRACED_KEYS, TRACED_SETTINGS


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
    variants of the training code (:mod:`probes.trace.variants`) unless ``variants`` is False."""

    model = cut_model(hf_config, dtype, attn_impl)
    with gpu_kernels(attention=attn_impl != "eager", target=target):
        traces = [trace_step(model, b, s) for b, s in FIT_SHAPES]
        check = trace_step(model, *CHECK_SHAPE)
        terms = fit_terms(traces, check)
        if generation:  # generation and scoring, as the RLHF probe runs them; formulas for them where that fails
            try:
                terms["windows"].update(trace_generation_terms(model))
            except Exception as err:
                terms["generation_unfitted"] = f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]}"
    if not variants:
        return terms
    traced, unfitted = trace_variants(hf_config, dtype, attn_impl, target)
    terms["variants"] = traced
    if unfitted:
        terms["variants_unfitted"] = unfitted
    return terms
