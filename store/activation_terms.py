"""Traced activation and loss terms: how their bytes follow the micro-batch shape, read without torch.

``probes.trace.activations`` traces a model's training step on the meta device at a few shapes and fits every
size it sees exactly as a polynomial in b (sequences) and s (tokens per sequence) over :data:`TERM_BASIS`.
The terms of one model are kept per dtype width and attention kernel (:func:`terms_key`) with its shape
(catalog package data, or the store's shape cache). Here they are evaluated at any shape:

- ``layer_saved``: the sizes one decoder layer saves for backward, in the order its forward makes them;
- ``outside_saved``: what the step saves outside the decoder layers (embedding output, masks, rotary tables,
  the final norm's input);
- ``windows``: ordered changes of live bytes (+ allocation, - free) of ``layer_forward``, ``layer_backward``
  (without the weight gradients it leaves behind), ``head_forward`` (LM head and loss, from the decoder's end
  until the loss is returned) and ``head_backward`` (from the backward's start until the gradient reaches the
  decoder layers), ``inference_forward`` (a no-grad forward until its LM head), and ``policy_head_forward`` /
  ``policy_head_backward``: the same two head windows of an RLHF actor, whose loss is built on the token
  log-probs of the model output (the fp32 log-softmax of the shifted logits). A window's peak is its highest
  running sum; what it leaves is its sum.
- ``layer_forward_tensors`` (where traced): every tensor one decoder layer's forward makes, in order, with
  when it is freed (``sizes``: fitted bytes; ``freed_after``: the index of the last of them made before its
  free, -1 for a saved one): the layer's temporaries between its saved tensors (:func:`layer_forward_tensors`);
  with ``held_over_layers``, the tensors the decoder holds from before its first layer to after its last
  (:func:`held_over_layers`).

Beside these terms of a full fine-tune, ``variants`` holds the same fields traced with the training code
changed (:data:`VARIANTS`): HF's own gradient checkpointing (``checkpointed``: a layer keeps its output as the
next layer's checkpoint; its backward window holds the recompute), LoRA adapters on every linear layer
(``lora``) and both (``lora_checkpointed``). LoRA terms depend on the adapter rank r too: their polynomials have
the two rank terms of TERM_BASIS (parameter-sized tensors of the adapters, and each adapter's b x s x r
output); a full fine-tune's have the first six. A variant that could not be traced is named with its reason
under ``variants_unfitted``; the cost model then composes it from the full fine-tune's terms.
"""

from __future__ import annotations

from typing import Any

Polynomial = list[float]  # coefficients over TERM_BASIS (the first six, or all eight for LoRA terms)
TERM_BASIS = ("1", "b", "s", "b*s", "s^2", "b*s^2", "r", "r*b*s")  # r: the LoRA rank (0 for a full fine-tune)
SHAPE_TERMS = 6  # the terms of a full fine-tune's polynomials
WINDOWS = ("layer_forward", "layer_backward", "head_forward", "head_backward", "inference_forward",
           "policy_head_forward", "policy_head_backward")  # fmt: skip
VARIANTS: dict[str, tuple[bool, bool]] = {  # (HF gradient checkpointing, LoRA) each variant is traced with
    "checkpointed": (True, False),
    "lora": (False, True),
    "lora_checkpointed": (True, True),
}
# Generation and scoring as the RLHF probe runs them (``probes.trace.generation``; b sequences, s the prompt,
# the KV cache's tokens at a decoding step, or the scored tokens); kept in ``windows`` beside WINDOWS.
LAYER_FORWARD_TENSORS = "layer_forward_tensors"
# Under LAYER_FORWARD_TENSORS (where traced): the tensors the decoder makes before its first layer and frees after
# its last, before the LM head (OPT's token and position embedding outputs), fitted sizes in the order made.
HELD_OVER_LAYERS = "held_over_layers"
# The tensors a decoder layer's backward makes (not the weights' gradients), in order, with when each is freed
# (``probes.trace.layer_backward``): fitted sizes and, for each, the index of the tensor after which it is freed.
LAYER_BACKWARD_TENSORS = "layer_backward_tensors"
GENERATION_WINDOWS = ("prefill", "prefill_head", "decode_step", "decode_head", "scoring_forward", "scoring_head")


def basis(sequences: int, tokens: int, rank: int = 0) -> tuple[int, ...]:
    """The values of TERM_BASIS at ``sequences`` x ``tokens`` with LoRA adapters of rank ``rank``."""
    b, s, r = sequences, tokens, rank
    return 1, b, s, b * s, s * s, b * s * s, r, r * b * s


def evaluate(coefficients: Polynomial, sequences: int, tokens: int, rank: int = 0) -> int:
    """Bytes of one fitted size at ``sequences`` x ``tokens`` (LoRA rank ``rank``)."""
    terms = basis(sequences, tokens, rank)
    return round(sum(c * t for c, t in zip(coefficients, terms, strict=False)))


_EVALUATED: dict[tuple[int, int, int, int], tuple[list[Polynomial], list[int]]] = {}
EVALUATED_KEPT = 65536


def _values(window: list[Polynomial], sequences: int, tokens: int, rank: int = 0) -> list[int]:
    """Each size of ``window`` at the job's size, remembered per window object (a search evaluates the same
    packaged windows at the same sizes thousands of times; the entry holds the window, so its id stays its)."""
    key = (id(window), sequences, tokens, rank)
    known = _EVALUATED.get(key)
    if known is not None and known[0] is window:
        return known[1]
    terms = basis(sequences, tokens, rank)
    values = [round(sum(c * t for c, t in zip(coefficients, terms, strict=False))) for coefficients in window]
    if len(_EVALUATED) >= EVALUATED_KEPT:
        _EVALUATED.clear()
    _EVALUATED[key] = (window, values)
    return values


def peak_of(window: list[Polynomial], sequences: int, tokens: int, rank: int = 0) -> int:
    """The most bytes a fitted window holds above its start at ``sequences`` x ``tokens`` (0 at least)."""
    live = peak = 0
    for change in _values(window, sequences, tokens, rank):
        live += change
        if live > peak:
            peak = live
    return peak


def left_by(window: list[Polynomial], sequences: int, tokens: int, rank: int = 0) -> int:
    """What a fitted window leaves alive at its end beyond its start."""
    return sum(_values(window, sequences, tokens, rank))


def evaluate_all(polynomials: list[Polynomial], sequences: int, tokens: int, rank: int = 0) -> tuple[int, ...]:
    """Bytes of each fitted size at ``sequences`` x ``tokens``, in order."""
    return tuple(_values(polynomials, sequences, tokens, rank))


def layer_forward_tensors(terms: dict[str, Any], sequences: int, tokens: int) -> tuple[tuple[int, int], ...]:
    """Each tensor a decoder layer's forward makes at ``sequences`` x ``tokens``, in order: (bytes, index of
    the last tensor made before it is freed, -1 for a saved one); empty where the terms do not carry them."""
    found = terms.get(LAYER_FORWARD_TENSORS)
    if not found:
        return ()
    sizes = _values(found["sizes"], sequences, tokens)
    return tuple((max(0, size), int(freed)) for size, freed in zip(sizes, found["freed_after"], strict=True))


def layer_backward_tensors(terms: dict[str, Any], sequences: int, tokens: int) -> tuple[tuple[int, int], ...]:
    """Each tensor a decoder layer's backward makes at ``sequences`` x ``tokens`` (not the weights' gradients), in
    order: (bytes, index of the last tensor made before it is freed, -1 for the gradient handed to the layer
    below); empty where the terms do not carry them."""
    found = terms.get(LAYER_BACKWARD_TENSORS)
    if not found:
        return ()
    sizes = _values(found["sizes"], sequences, tokens)
    return tuple((max(0, size), int(freed)) for size, freed in zip(sizes, found["freed_after"], strict=True))


def held_over_layers(terms: dict[str, Any], sequences: int, tokens: int) -> tuple[int, ...]:
    """Bytes of each tensor the decoder's forward makes before its first layer and frees after its last (before
    the LM head) at ``sequences`` x ``tokens``, in order; empty where the terms do not carry them."""
    found = terms.get(LAYER_FORWARD_TENSORS) or {}
    return tuple(max(0, size) for size in _values(found.get(HELD_OVER_LAYERS, []), sequences, tokens))


def variant_name(checkpointing: bool, lora: bool) -> str | None:
    """The key under ``variants`` of terms traced with this training code (None: the full fine-tune's own)."""
    return next((name for name, flags in VARIANTS.items() if flags == (checkpointing, lora)), None)


def variant_terms(terms: dict[str, Any], checkpointing: bool, lora: bool) -> dict[str, Any] | None:
    """The fields (``layer_saved``, ``outside_saved``, ``windows``) traced with this training code: the terms
    themselves for a plain full fine-tune, a traced variant, or None where that variant was not traced."""
    name = variant_name(checkpointing, lora)
    if name is None:
        return terms
    found: dict[str, Any] | None = terms.get("variants", {}).get(name)
    return found


def terms_key(dtype: str, attn_impl: str) -> str:
    """The key of a model's terms for a training dtype and attention implementation: the dtype width and the
    kernel (``flash_attention_2`` keeps what sdpa's flash kernel keeps, so both read the ``sdpa`` trace).

    The ``sdpa`` trace runs the kernel a current GPU picks: flash for 16-bit inputs, memory-efficient for fp32
    (``probes.trace.activations``). The cost model names another GPU's kernel ``sdpa-efficient`` (a V100 or T4 in
    fp16, which read the same trace: the two kernels save the same tensors but for the log-sum-exp's padded
    rows) or ``sdpa-math`` (which reads no trace: ``search.model.kernels.attention_impl``)."""
    width = 4 if dtype == "fp32" else 2
    return f"{width}-{'eager' if attn_impl == 'eager' else 'sdpa'}"


TRACED_SETTINGS: dict[str, tuple[str, str]] = {  # the dtype and attention each key is traced with
    "2-eager": ("bf16", "eager"),
    "2-sdpa": ("bf16", "sdpa"),
    "4-eager": ("fp32", "eager"),
    "4-sdpa": ("fp32", "sdpa"),
}
TRACED_KEYS = tuple(TRACED_SETTINGS)


def compact(window: list[Polynomial]) -> list[Polynomial]:
    """A window with each run of allocations (and each run of frees) summed into one change: the same
    running-sum peaks and end at every shape, fewer numbers to keep. A change whose coefficients differ in
    sign (growing at some shapes, shrinking at others) is kept on its own."""
    out: list[Polynomial] = []
    last = 0
    for coefficients in window:
        sign = 1 if min(coefficients) >= 0 else -1 if max(coefficients) <= 0 else 0
        if out and sign and sign == last:
            out[-1] = [a + b for a, b in zip(out[-1], coefficients, strict=True)]
        else:
            out.append(list(coefficients))
        last = sign
    return out


def valid_terms(terms: Any) -> bool:
    """Whether ``terms`` has the shape of one traced entry (a damaged or older cache entry has not)."""
    if not _valid_fields(terms, WINDOWS):
        return False
    variants = terms.get("variants", {})
    if not isinstance(variants, dict) or not set(variants) <= set(VARIANTS):
        return False
    return all(_valid_fields(fields, WINDOWS) for fields in variants.values())


def _valid_fields(terms: Any, windows: tuple[str, ...]) -> bool:
    if not isinstance(terms, dict) or not isinstance(terms.get("windows"), dict):
        return False
    polys = [*terms.get("layer_saved", [None]), terms.get("outside_saved")]
    polys += [p for w in windows for p in terms["windows"].get(w, [None])]
    polys += [p for w in GENERATION_WINDOWS for p in terms["windows"].get(w, [])]  # where they were traced
    forward = terms.get(LAYER_FORWARD_TENSORS, {"sizes": [], "freed_after": []})
    if not isinstance(forward, dict) or len(forward.get("sizes", ())) != len(forward.get("freed_after", [None])):
        return False
    polys += forward["sizes"] + forward.get(HELD_OVER_LAYERS, [])
    backward = terms.get(LAYER_BACKWARD_TENSORS, {"sizes": [], "freed_after": []})
    if not isinstance(backward, dict) or len(backward.get("sizes", ())) != len(backward.get("freed_after", [None])):
        return False
    polys += backward["sizes"]
    return all(isinstance(p, list) and len(p) in (SHAPE_TERMS, len(TERM_BASIS)) for p in polys)
