"""Activation and loss bytes traced with the training code changed: HF gradient checkpointing and LoRA.

The full fine-tune's terms (:func:`probes.trace.terms.trace_terms`) say what a plain step keeps. Two
knobs change which tensors the model code keeps, so they are traced as such rather than composed:

- **checkpointing**: the cut model runs ``probes.model.build.enable_checkpointing`` (HF's own
  ``gradient_checkpointing_enable`` with ``use_reentrant=False``, as the probes and the export set it up). A
  layer then keeps only its output, as the next layer's checkpoint (torch's saved-tensor holders), and its
  backward window holds the recompute of its forward with the backward that follows;
- **LoRA**: ``probes.model.lora.add_lora`` puts a rank-r adapter on every linear layer of the decoder blocks (the
  shape of peft's ``target_modules="all-linear"``) and freezes the rest. A frozen weight's product keeps no
  input for a weight gradient, a frozen norm's weight keeps none of its own input, and the embeddings' output
  needs no gradient; each adapter keeps its b x s x r output.

LoRA terms are fitted over the adapter rank as well: the six shapes of the full fine-tune at rank
:data:`LORA_RANK`, two of them again at :data:`LORA_SECOND_RANK` (the ``r`` and ``r*b*s`` terms of
``store.activation_terms.TERM_BASIS``), and checked at a shape and a rank used for neither.
"""

from __future__ import annotations

from typing import Any

from probes.trace.activations import (
    CHECK_SHAPE,
    FIT_POINTS,
    FIT_SHAPES,
    StepTrace,
    cut_model,
    fit_terms,
    gpu_kernels,
    trace_step,
)
from store.activation_terms import VARIANTS

LORA_RANK = 8
LORA_SECOND_RANK = 16
LORA_CHECK_RANK = 4
LORA_POINTS: tuple[tuple[int, ...], ...] = (
    *((b, s, LORA_RANK) for b, s in FIT_SHAPES),
    (*FIT_SHAPES[0], LORA_SECOND_RANK),
    (*FIT_SHAPES[-1], LORA_SECOND_RANK),
)
LORA_CHECK_POINT = (*CHECK_SHAPE, LORA_CHECK_RANK)


def variant_model(hf_config: dict[str, Any], dtype: str, attn_impl: str, checkpointed: bool, rank: int,
                  device: str = "meta") -> Any:  # fmt: skip
    """The two-layer cut model with HF checkpointing on (``checkpointed``) and LoRA of rank ``rank`` (0: none),
    as the probes build a trained model (:func:`probes.model.build.prepare_trained`)."""
    from probes.model.build import prepare_trained

    model = cut_model(hf_config, dtype, attn_impl, device=device)
    prepare_trained(model, checkpointed, rank)
    return model


def trace_variant(
    hf_config: dict[str, Any], dtype: str, attn_impl: str, checkpointed: bool, lora: bool, target: str = "cuda"
) -> dict[str, Any]:
    """The fitted terms of one variant (FitError, or the model code's own error, where it cannot be traced)."""
    points, check_point = (LORA_POINTS, LORA_CHECK_POINT) if lora else (FIT_POINTS, (*CHECK_SHAPE, 0))
    models: dict[int, Any] = {}

    def step(b: int, s: int, rank: int) -> StepTrace:
        if rank not in models:
            models[rank] = variant_model(hf_config, dtype, attn_impl, checkpointed, rank)
        return trace_step(models[rank], b, s, checkpointed=checkpointed)

    with gpu_kernels(attention=attn_impl != "eager", target=target):
        traces = [step(*point) for point in points]
        check = step(*check_point)
    return fit_terms(traces, check, points, check_point)


def trace_variants(
    hf_config: dict[str, Any], dtype: str, attn_impl: str, target: str = "cuda"
) -> tuple[dict[str, Any], dict[str, str]]:
    """The terms of every variant of ``store.activation_terms.VARIANTS`` that can be traced, and the reason
    for each that cannot (the cost model then composes it from the full fine-tune's terms)."""
    variants: dict[str, Any] = {}
    unfitted: dict[str, str] = {}
    for name, (checkpointed, lora) in VARIANTS.items():
        try:
            variants[name] = trace_variant(hf_config, dtype, attn_impl, checkpointed, lora, target)
        except Exception as err:  # an op without a meta kernel, no exact fit, model code that refuses the knob
            first_line = (str(err).splitlines() or [""])[0][:200]
            unfitted[name] = f"{type(err).__name__}: {first_line}"
    return variants, unfitted
