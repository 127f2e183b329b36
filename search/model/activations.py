"""Bytes per GPU of one micro-batch's activations, logits and loss, as transformers' model code keeps them.

Traced where the model carries traced terms for the dtype and attention (``ModelSpec.activation_terms``, read
from the model's own code on the meta device by ``probes.trace.activations``: the catalog's package data and
the store's cache); otherwise pure formulas: Korthikanti et al. 2022 generalised per decoder layer (attention
implementation, dropout, RMSNorm, gated MLPs), the LM head's logits with the fp32 upcast of the loss, and the
tied-embedding sum. :func:`search.model.activation_sources.source` says which one a prediction used.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from search.coefficients import Coefficients
from search.model.activation_sources import traced_terms, traced_variant
from search.model.kernels import SDPA_MATH, efficient_lse_padding, math_sdpa_saved, with_lse_padding
from search.model.shapes import dropout_probs, token_embedding_params, uses_rmsnorm
from store.activation_terms import evaluate, evaluate_all, left_by, peak_of
from store.loss_chunks import chunk_tokens
from store.records import DTYPE_BYTES, ModelSpec


@dataclass(frozen=True)
class LossLogits:
    """Bytes of the LM head's logits and the loss over them, at the moments they peak."""

    forward: int  # while the loss runs: 16-bit logits, their fp32 upcast and the log-softmax output
    backward: int  # while the loss backward runs: the held logits, log-softmax output and two fp32 gradients
    held: int  # the 16-bit logits the model output keeps alive through the whole backward
    # transformers' cross-entropy over every logit (ForCausalLMLoss): the logits' elements, for the tensors
    # the allocation stream makes by name (search.model.deepspeed_tensors.loss_tensors); 0 for other losses
    cross_entropy_elements: int = 0


@lru_cache(maxsize=4096)
def loss_logits(
    model: ModelSpec,
    sequences: int,
    seq_len: int,
    dtype: str,
    coef: Coefficients,
    *,
    holds_output: bool = True,
    attn_impl: str = "sdpa",
    loss: str = "hf",
    checkpointing: bool = False,
    lora_rank: int = 0,
    policy: bool = False,
) -> LossLogits:
    """Logit bytes of a training micro-batch (transformers' ForCausalLMLoss, or a log-softmax of DPO).

    ``logits.float()`` is a copy unless training in fp32; cross_entropy's log_softmax output is fp32 and
    saved for the backward; the backward adds the fp32 gradients of the NLL and of the log-softmax
    (``coef.logits_peak_bytes`` with the log-softmax output). The 16-bit logits stay alive through the
    backward only where the training loop holds the model output (``holds_output``): DeepSpeed-Chat's actor
    loop does (``actor_prob = ...logits`` until ``backward``), HF Trainer's ``training_step`` and TRL's
    SFTTrainer keep only the loss (on the H100 records this is the 2 bytes per logit between the two).
    """
    elements = sequences * seq_len * model.vocab_size
    d = DTYPE_BYTES[dtype]
    if loss == "chunked":
        return chunked_loss_logits(model, sequences * seq_len, d)
    upcast = 4 if d != 4 else 0
    held = d * elements if holds_output else 0
    traced = traced_variant(model, dtype, attn_impl, checkpointing, lora_rank)
    if traced is None:  # a variant not traced: the full fine-tune's head and loss
        traced = traced_terms(model, dtype, attn_impl)
    if traced is not None:  # the head and loss as traced: the output dropped once the loss is computed
        head, r = traced["windows"], lora_rank
        # an RLHF actor's loss is built on the token log-probs of the model output, where that was traced
        prefix = "policy_" if policy and "policy_head_forward" in head else ""
        forward, backward = f"{prefix}head_forward", f"{prefix}head_backward"
        kept = left_by(head[forward], sequences, seq_len, r)
        return LossLogits(
            forward=peak_of(head[forward], sequences, seq_len, r),
            backward=held + kept + peak_of(head[backward], sequences, seq_len, r),
            held=int(held),
            cross_entropy_elements=0 if prefix else elements,
        )
    return LossLogits(
        forward=int((d + upcast + 4) * elements),
        backward=int(held + coef.logits_peak_bytes * elements),
        held=int(held),
        cross_entropy_elements=0 if policy else elements,
    )


def chunked_loss_logits(model: ModelSpec, tokens: int, d: int) -> LossLogits:
    """Logit bytes of a chunked loss (``probes.model.chunked_loss``): one chunk of ``store.loss_chunks.chunk_tokens``
    tokens at a time, nothing held. Forward: the chunk's 16-bit logits, their fp32 upcast and the fp32
    log-softmax. Backward (the chunk recomputed): those, the fp32 gradients of the log-softmax's output and
    input, the 16-bit gradient of the logits, and the gradient of the hidden states, which fills as chunks go.
    """
    elements = chunk_tokens(tokens, model.vocab_size, model.hidden_size) * model.vocab_size
    upcast = 4 if d != 4 else 0
    return LossLogits(
        forward=(d + upcast + 4) * elements,
        backward=(2 * d + upcast + 12) * elements + d * tokens * model.hidden_size,
        held=0,
    )


def tied_embedding_extra(model: ModelSpec, dtype: str, lora_rank: int, lm_head: bool) -> int:
    """Extra bytes while the gradient of a tied embedding/LM-head weight is formed, at the backward's end.

    Autograd sums the LM head's contribution (held in the input buffer since the head's backward) with the
    embedding's own dense gradient out of place: three vocabulary-sized tensors at once, one of which
    becomes the gradient. Untied or frozen (LoRA) embeddings have no such sum.
    """
    if not (lm_head and model.tie_word_embeddings) or lora_rank > 0:
        return 0
    return 2 * DTYPE_BYTES[dtype] * token_embedding_params(model)


def _relu(model: ModelSpec) -> bool:
    """The MLP activation is ReLU (OPT's default), whose autograd node saves only its result."""
    cfg = model.hf_config
    return str(cfg.get("activation_function", cfg.get("hidden_act", ""))) == "relu"


@dataclass(frozen=True)
class Activations:
    """Activation bytes of one micro-batch: what backward keeps, and one layer's full set."""

    saved: int  # all layers, as kept for backward (or the checkpoints under recompute)
    layer: int  # one layer without checkpointing: the recompute and backward working set
    forward_working: int  # live while a no-grad forward (inference) runs one layer
    backward_working: int = 0  # activation gradients of the layer being differentiated, beside the saved ones
    recompute: int = 0  # re-made by a checkpointed layer's recompute beside backward_working (0: in it already)
    checkpointed_forward: int = 0  # live while a checkpointed layer's forward runs (its working tensors)


@lru_cache(maxsize=4096)
def layer_saved_tensors(
    model: ModelSpec, sequences: int, seq_len: int, dtype: str, attn_impl: str, coef: Coefficients
) -> tuple[int, ...]:
    """Bytes of each tensor one decoder layer saves for backward, in the order its forward makes them.

    Korthikanti et al. 2022, generalised: with h=hidden, i=intermediate and OPT/GPT shapes in fp16 with
    eager attention and dropout the sum is sbh(34 + 5as/h) as in the paper, up to the fp32 softmax that HF's
    eager attention keeps. The sizes (not only their sum) are what torch's caching allocator sees
    (:mod:`search.streams`).
    """
    traced = traced_terms(model, dtype, attn_impl)
    if traced is not None:
        sizes = tuple(max(0, size) for size in evaluate_all(traced["layer_saved"], sequences, seq_len))
        return with_lse_padding(sizes, model, sequences, seq_len, dtype, attn_impl)
    d = DTYPE_BYTES[dtype]
    bs = sequences * seq_len
    h, i = model.hidden_size, model.intermediate_size
    q_dim = model.num_heads * model.head_dim
    kv_dim = model.num_kv_heads * model.head_dim
    attn_p, hidden_p = dropout_probs(model)
    norm = (d + coef.rmsnorm_extra_bytes) if uses_rmsnorm(model) else d
    tensors = [norm * bs * h]  # the attention norm's input
    tensors.append(d * bs * h)  # QKV projection input
    if attn_impl == "eager":
        # repeat_kv expands K and V to every head before the score matmul
        tensors += [d * bs * q_dim] * 3
        scores = sequences * model.num_heads * seq_len * seq_len
        tensors += [coef.eager_softmax_bytes * scores, d * scores]
        if attn_p > 0:
            tensors.append(scores)  # dropout mask, one byte per element
    elif attn_impl == SDPA_MATH:
        tensors += math_sdpa_saved(model, sequences, seq_len, dtype, attn_p)
    else:
        tensors += [d * bs * q_dim, d * bs * kv_dim, d * bs * kv_dim, d * bs * q_dim]  # q, k, v, the output
    tensors.append(d * bs * q_dim)  # output projection input
    if hidden_p > 0:
        tensors.append(bs * h)  # residual dropout mask after attention
    tensors.append(norm * bs * h)  # the MLP norm's input
    tensors.append(d * bs * h)  # MLP input
    # gated: gate and up outputs, the activation's output and down's input; ReLU saves only its output, which is
    # also fc2's input (the fc1 output is freed); GELU-style activations keep their input as well
    tensors += [d * bs * i] * (4 if model.gated_mlp else (1 if _relu(model) else 2))
    if hidden_p > 0:
        tensors.append(bs * h)  # residual dropout mask after the MLP
    return tuple(int(t) for t in tensors)


def layer_activation_bytes(
    model: ModelSpec, sequences: int, seq_len: int, dtype: str, attn_impl: str, coef: Coefficients
) -> int:
    """Bytes one decoder layer saves for backward: the sum of :func:`layer_saved_tensors`."""
    return sum(layer_saved_tensors(model, sequences, seq_len, dtype, attn_impl, coef))


@lru_cache(maxsize=4096)
def activations(
    model: ModelSpec,
    sequences: int,
    seq_len: int,
    dtype: str,
    attn_impl: str,
    checkpointing: bool,
    coef: Coefficients,
    lora_rank: int = 0,
) -> Activations:
    """Activation bytes of a micro-batch of ``sequences`` sequences of ``seq_len`` tokens, trained with HF
    gradient checkpointing or not and LoRA adapters of rank ``lora_rank`` (0: a full fine-tune).

    Where the model has the variant traced as such (:func:`traced_variant`) every figure is read from it: a
    checkpointed layer keeps its traced checkpoint, and its traced backward window holds the recompute.
    Otherwise the step is composed from the full fine-tune's terms (or formulas): under recompute each layer
    keeps its input, and the recompute re-makes one layer's saved tensors beside its backward working set.
    """
    d = DTYPE_BYTES[dtype]
    bs_h = sequences * seq_len * model.hidden_size
    layer = layer_activation_bytes(model, sequences, seq_len, dtype, attn_impl, coef)
    variant = traced_variant(model, dtype, attn_impl, checkpointing, lora_rank)
    traced = traced_terms(model, dtype, attn_impl)
    forward_working = 2 * d * bs_h + layer // 2
    if traced is not None and "inference_forward" in traced["windows"]:
        forward_working = peak_of(traced["windows"]["inference_forward"], sequences, seq_len)
    if variant is not None:
        r = lora_rank
        windows = variant["windows"]
        if "inference_forward" in windows:  # LoRA's adapters run beside the frozen weights
            forward_working = peak_of(windows["inference_forward"], sequences, seq_len, r)
        per_layer = sum(evaluate_all(variant["layer_saved"], sequences, seq_len, r))
        if not checkpointing:  # a checkpointed layer keeps its input only; the padded rows live in its recompute
            per_layer += efficient_lse_padding(model, sequences, seq_len, dtype, attn_impl)
        return Activations(
            saved=model.num_layers * per_layer + evaluate(variant["outside_saved"], sequences, seq_len, r),
            layer=layer,
            forward_working=forward_working,
            backward_working=peak_of(windows["layer_backward"], sequences, seq_len, r),
            checkpointed_forward=peak_of(windows["layer_forward"], sequences, seq_len, r) if checkpointing else 0,
        )
    outside_layers = 3 * d * bs_h  # embedding output, final norm input, LM head input
    backward_working = coef.backward_working_layers * layer
    if traced is not None:
        outside_layers = evaluate(traced["outside_saved"], sequences, seq_len)
        backward_working = peak_of(traced["windows"]["layer_backward"], sequences, seq_len)
    per_layer = d * bs_h if checkpointing else layer  # under recompute each layer keeps only its input
    saved = model.num_layers * per_layer + outside_layers
    return Activations(
        saved=int(saved),
        layer=int(layer),
        forward_working=int(forward_working),
        backward_working=int(backward_working),
        recompute=int(layer) if checkpointing else 0,
        checkpointed_forward=int(forward_working) if checkpointing else 0,
    )


def logits_bytes(model: ModelSpec, sequences: int, seq_len: int, dtype: str, coef: Coefficients) -> tuple[int, int]:
    """(training peak, no-grad forward peak) of the LM head's logits and the loss over them.

    Training: transformers' ForCausalLMLoss upcasts to fp32 and keeps the log-softmax output, and the
    backward holds two fp32 gradients of the same size. Inference: 16-bit logits plus the fp32 upcast.
    """
    elements = sequences * seq_len * model.vocab_size
    d = DTYPE_BYTES[dtype]
    training = int(max(coef.logits_peak_bytes, d + 8) * elements)
    inference = int((d + 4) * elements)
    return training, inference
