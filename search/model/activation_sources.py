"""Where a prediction's activation and loss bytes come from: the model's traced terms, or the formulas, and why.

:func:`traced_terms` and :func:`traced_variant` read ``ModelSpec.activation_terms`` (traced from the model's own
code by ``probes.trace.activations``); :func:`source`, :func:`formula_reason` and :func:`variant_sources` say
which a prediction used, for the plan's text and JSON.
"""

from __future__ import annotations

from typing import Any

from search.model.kernels import SDPA_MATH
from store.activation_terms import VARIANTS, terms_key, variant_terms
from store.records import ModelSpec


def traced_terms(model: ModelSpec, dtype: str, attn_impl: str) -> dict[str, Any] | None:
    """The model's traced activation and loss terms of a full fine-tune for this dtype and attention, or
    None (formulas). sdpa's math path (:data:`search.model.kernels.SDPA_MATH`) has no trace: its scores are
    what the formulas keep."""
    if attn_impl == SDPA_MATH:
        return None
    return model.activation_terms.get(terms_key(dtype, attn_impl))


def traced_variant(
    model: ModelSpec, dtype: str, attn_impl: str, checkpointing: bool, lora_rank: int
) -> dict[str, Any] | None:
    """The terms traced with this training code (HF gradient checkpointing, LoRA adapters), or None where
    the model has no traced terms or that variant could not be traced (then composed from the full
    fine-tune's terms, or the formulas)."""
    terms = traced_terms(model, dtype, attn_impl)
    return None if terms is None else variant_terms(terms, checkpointing, lora_rank > 0)


def source(model: ModelSpec, dtype: str, attn_impl: str, windows: tuple[str, ...] = ()) -> str:
    """Where a prediction's activation and loss bytes come from: ``"traced"`` or ``"formula"``; with
    ``windows``, traced only where the terms have those windows too (RLHF: generation and scoring)."""
    traced = traced_terms(model, dtype, attn_impl)
    return "traced" if traced and all(w in traced["windows"] for w in windows) else "formula"


def formula_reason(model: ModelSpec, dtype: str, attn_impl: str, windows: tuple[str, ...] = ()) -> str | None:
    """Why the prediction's activation and loss bytes of ``model`` come from the formulas (None: they are
    traced): the kernel no trace follows, the trace that failed and its error, a model counted by formula and
    where its config stands against the catalog, a setting not traced, or generation and scoring not traced.
    A traced hybrid of linear and full attention says how it was traced instead (:func:`hybrid_note`)."""
    key = terms_key(dtype, attn_impl)
    if attn_impl == SDPA_MATH:
        return "this GPU's sdpa runs the math kernel, which keeps the s x s scores: no trace follows it"
    terms = model.activation_terms.get(key)
    if terms is None:
        if key in model.activation_unfitted:
            return f"the trace of {model.model_type} ({key}) failed: {model.activation_unfitted[key]}"
        if not model.activation_terms:
            where = f": {model.identity}" if model.identity else ""
            return f"{model.name} is counted by formula (model_type {model.model_type}), not traced{where}"
        traced = ", ".join(sorted(k for k in model.activation_terms if k != key))
        width = "4-byte (fp32)" if key.startswith("4-") else "16-bit"
        return f"{model.name} has no trace of {width} training with {key.split('-', 1)[1]} (traced: {traced})"
    missing = [w for w in windows if w not in terms["windows"]]
    if missing:
        why = terms.get("generation_unfitted") or "not traced for this model"
        return f"generation and scoring ({', '.join(missing[:2])}...) are not traced: {why}"
    return hybrid_note(terms)


def hybrid_note(terms: dict[str, Any]) -> str | None:
    """How a hybrid's traced terms were had (``probes.trace.hybrid``): each kind of layer traced and weighted by
    its count, and which Gated DeltaNet code the linear-attention layers ran; None for any other model. It is the
    stated reason of a traced hybrid (:func:`formula_reason`), since its bytes follow that code."""
    hybrid = terms.get("hybrid")
    if not isinstance(hybrid, dict):
        return None
    layers = " + ".join(f"{count} {kind}" for kind, count in hybrid.get("layers", {}).items())
    return (
        f"traced per kind of layer ({layers} layers), the linear-attention layers through "
        f"{hybrid.get('linear_attention')}; with flash-linear-attention's CUDA kernels the saved tensors differ"
    )


def variant_sources(model: ModelSpec, dtype: str, attn_impl: str) -> dict[str, str]:
    """How each training variant's bytes are had: ``traced`` (the variant traced as such), ``composed`` (from
    the full fine-tune's trace: the variant could not be traced) or ``formula``."""
    terms = traced_terms(model, dtype, attn_impl)
    if terms is None:
        return dict.fromkeys(VARIANTS, "formula")
    return {name: "traced" if name in terms.get("variants", {}) else "composed" for name in VARIANTS}
