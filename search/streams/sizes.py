"""The sizes in which a model's bytes reach torch's caching allocator: one tensor at a time, not one sum.

The cost model counts bytes per part (parameters, gradients, activations, logits, ...); the allocator's
reserved memory depends on the sizes of the requests that make them up (which pool, which segment, which
cached block a request can reuse). A :data:`Sizes` maps a part's name to the pattern of tensor sizes it is
made of, in the order the program makes them: a model's weights as they are loaded (embedding first, then
every block's matrices and norms), a decoder layer's saved activations as its forward makes them
(:func:`search.model.activations.layer_saved_tensors`), the loss's logits and their fp32 copies, DeepSpeed's
buckets. A part's bytes are requested as its pattern repeated (the last request cut to what is left), so a
stream built from the cost model's bytes (:mod:`search.streams.build`) has exactly those bytes.
"""

from __future__ import annotations

from functools import lru_cache

from search.coefficients import Coefficients
from search.model.activation_sources import traced_terms
from search.model.activations import layer_saved_tensors
from search.model.micro_batch import MicroBatchContext
from search.model.moment_parts import FP32_UPCASTS
from search.model.placement import TrainedPlacement
from search.model.quantized import quantized_weight_elements
from search.model.shapes import linear_shapes, token_embedding_params
from store.activation_terms import held_over_layers, layer_backward_tensors, layer_forward_tensors
from store.loss_chunks import chunk_tokens
from store.quantization import quantized_linear_bytes
from store.records import DTYPE_BYTES, ModelSpec

Sizes = tuple[tuple[str, tuple[int, ...]], ...]  # (part or resident name, tensor sizes in bytes) pairs
# A decoder layer's forward as its code runs it (:func:`layer_forward_program`): every tensor it makes, in order,
# and for each 0 (saved for the backward) or 1 + the index of the last tensor made before it is freed.
FORWARD_MADE, FORWARD_FREED = "activations:forward_made", "activations:forward_freed"
# What the decoder's forward holds from before its first layer to after its last (:func:`layer_forward_program`).
FORWARD_HELD = "activations:forward_held"
# Under gradient checkpointing, the same layer forward as the recompute inside the backward runs it
# (:func:`recompute_program`): the tensors up to the last saved one, in FORWARD_FREED's encoding.
RECOMPUTE_MADE, RECOMPUTE_FREED = "activations:recompute_made", "activations:recompute_freed"
# A decoder layer's backward as autograd runs it (:func:`layer_backward_program`), in FORWARD_FREED's encoding
# (0: the gradient handed to the layer below).
BACKWARD_MADE, BACKWARD_FREED = "activations:backward_made", "activations:backward_freed"


def sizes_of(**patterns: tuple[int, ...]) -> Sizes:
    """A :data:`Sizes` from keyword patterns (empty patterns dropped)."""
    return tuple((name, tuple(int(s) for s in sizes if s > 0)) for name, sizes in patterns.items() if sizes)


@lru_cache(maxsize=256)
def weight_tensors(
    model: ModelSpec, dtype: str, lora_rank: int = 0, quantization: str = "none", zero_stage: int = 0
) -> tuple[int, ...]:
    """Bytes of each weight tensor in load order: the token embedding, each block's norms and linears
    (and their LoRA A and B), the final norm and an untied LM head. QLoRA's block linears are bitsandbytes'
    (``quantization``): codes and constants (:func:`store.quantization.quantized_linear_bytes`), or under
    ZeRO-3 the codes as the compute-dtype elements DeepSpeed holds
    (:func:`search.model.quantized.quantized_weight_elements`)."""
    d = DTYPE_BYTES[dtype]
    h = model.hidden_size
    block: list[int] = [d * h]  # the attention norm
    for n_in, n_out in linear_shapes(model):
        if quantization == "none":
            block.append(d * n_in * n_out)
        elif zero_stage == 3:
            block.append(d * quantized_weight_elements(quantization, dtype, n_in * n_out))
        else:
            block.append(quantized_linear_bytes(quantization, n_in, n_out))
        if lora_rank:
            block += [d * n_in * lora_rank, d * lora_rank * n_out]
    block.insert(5 if not lora_rank else 13, d * h)  # the MLP norm, after the attention's four linears
    tensors = [d * token_embedding_params(model)] + block * model.num_layers + [d * h]
    if model.lm_head_params:
        tensors.append(d * model.lm_head_params)
    return tuple(tensors)


@lru_cache(maxsize=1024)
def activation_tensors(
    model: ModelSpec, sequences: int, seq_len: int, dtype: str, attn_impl: str, coef: Coefficients
) -> tuple[int, ...]:
    """A decoder layer's saved tensors at this shape (repeated layer after layer)."""
    return layer_saved_tensors(model, sequences, seq_len, dtype, attn_impl, coef)


@lru_cache(maxsize=1024)
def checkpointed_activation_tensors(
    model: ModelSpec, sequences: int, seq_len: int, dtype: str, attn_impl: str, coef: Coefficients
) -> tuple[int, ...]:
    """Under gradient checkpointing: each decoder layer's checkpoint, layer after layer (the non-reentrant
    checkpoint saves the layer's input hidden states, ``sequences x seq_len x hidden``; the rotary cos/sin
    are one pair shared by every layer), then what recomputing one layer in the backward makes (its saved
    tensors)."""
    checkpoint = DTYPE_BYTES[dtype] * sequences * seq_len * model.hidden_size
    return (checkpoint,) * model.num_layers + activation_tensors(model, sequences, seq_len, dtype, attn_impl, coef)


@lru_cache(maxsize=1024)
def layer_forward_program(
    model: ModelSpec, sequences: int, seq_len: int, dtype: str, attn_impl: str, coef: Coefficients
) -> Sizes:
    """The :data:`FORWARD_MADE` and :data:`FORWARD_FREED` patterns of one decoder layer's forward without
    checkpointing, from the traced ``layer_forward_tensors`` (``probes.trace.activations``): the saved tensors
    (:func:`activation_tensors`, in their order) with the temporaries the layer's code makes and frees between
    them (OPT's ``q_proj`` output before ``* self.scaling``, ``out_proj``'s and ``fc2``'s outputs before dropout
    and the dropout outputs once the residual add has read them, ``fc1``'s output before the ReLU that saves its
    own: transformers' ``modeling_opt.py``), and the :data:`FORWARD_HELD` tensors the decoder makes before its
    first layer and frees after its last (OPT's token and position embedding outputs, a Llama-style decoder's
    embedding output: the traced ``held_over_layers``). Empty where the model's terms do not carry them."""
    traced = traced_terms(model, dtype, attn_impl)
    tensors = layer_forward_tensors(traced, sequences, seq_len) if traced is not None else ()
    saved = activation_tensors(model, sequences, seq_len, dtype, attn_impl, coef)
    if sum(1 for _, freed in tensors if freed < 0) != len(saved):
        return ()
    made, order, kept = [], [], iter(saved)
    for size, freed in tensors:  # a saved tensor as activation_tensors sizes it (the padded log-sum-exp)
        made.append(next(kept) if freed < 0 else size)
        order.append(freed + 1)
    held = held_over_layers(traced, sequences, seq_len) if traced is not None else ()
    return ((FORWARD_MADE, tuple(made)), (FORWARD_FREED, tuple(order))) + sizes_of(**{FORWARD_HELD: held})


@lru_cache(maxsize=1024)
def layer_backward_program(model: ModelSpec, sequences: int, seq_len: int, dtype: str, attn_impl: str) -> Sizes:
    """The :data:`BACKWARD_MADE` and :data:`BACKWARD_FREED` patterns of one decoder layer's backward, from the
    traced ``layer_backward_tensors`` (``probes.trace.layer_backward``): each op's input gradient and the
    residual's sums as autograd makes them, each freed once read, the weights' gradients left to the cost
    model's gradients. Empty where the model's terms do not carry them."""
    traced = traced_terms(model, dtype, attn_impl)
    tensors = layer_backward_tensors(traced, sequences, seq_len) if traced is not None else ()
    if not tensors:
        return ()
    return (BACKWARD_MADE, tuple(size for size, _ in tensors)), (BACKWARD_FREED, tuple(f + 1 for _, f in tensors))


def recompute_program(forward: Sizes) -> Sizes:
    """The :data:`RECOMPUTE_MADE` and :data:`RECOMPUTE_FREED` patterns of a checkpointed layer's recompute, from
    its forward's program (:func:`layer_forward_program`; empty where that is). torch's non-reentrant
    checkpoint (``torch.utils.checkpoint``, torch 2.x: ``_checkpoint_without_reentrant_generator``, whose
    ``_recomputation_hook`` packs each recomputed saved tensor into the frame and, with ``early_stop`` on by
    default, raises ``_StopRecomputationError`` once it holds as many as the forward saved) runs the layer's
    forward again inside the backward, as its first saved tensor is unpacked, and stops after its last saved
    tensor: the tensors made up to that one, the temporaries among them freed where the forward frees them
    and the rest when the stop unwinds the layer's frames. transformers 5 asks for the non-reentrant
    checkpoint (``modeling_utils.gradient_checkpointing_enable``: ``use_reentrant=False``; memplan's probe
    too: ``probes.model.build``)."""
    program = dict(forward)
    made, freed = program.get(FORWARD_MADE, ()), program.get(FORWARD_FREED, ())
    if 0 not in freed:
        return ()
    last = max(i for i, order in enumerate(freed) if order == 0)
    return ((RECOMPUTE_MADE, made[: last + 1]), (RECOMPUTE_FREED, freed[: last + 1]))


def logit_tensors(model: ModelSpec, sequences: int, seq_len: int, dtype: str, loss: str = "hf") -> tuple[int, ...]:
    """The LM head's 16-bit logits, then the fp32 tensors of the loss (upcast, log-softmax, gradients): of the
    whole micro-batch, or of one chunk of tokens for a chunked loss (``store.loss_chunks``)."""
    tokens = sequences * seq_len
    if loss == "chunked":
        tokens = chunk_tokens(tokens, model.vocab_size, model.hidden_size)
    elements = tokens * model.vocab_size
    return (DTYPE_BYTES[dtype] * elements,) + (4 * elements,) * 3


@lru_cache(maxsize=1024)
def training_sizes(placed: TrainedPlacement, batch: MicroBatchContext) -> Sizes:
    """The live parts of a trained model's micro-step: gradients come in reverse load order (the backward
    reaches the top block first), activations layer by layer, logits and the loss's fp32 tensors, ZeRO-1/2's
    reduce buckets of ``ZeroWorkspace.reduce_bucket`` bytes each; checkpointed, the activations are the layers'
    checkpoints first (:func:`checkpointed_activation_tensors`) and the recompute runs the layer's forward program
    (:func:`recompute_program`); the top layer's backward runs the layer's backward program
    (:func:`layer_backward_program`); with TRL's fused head (``batch.head``) its
    tensors in place of the logits (``search.model.fused_head.FusedHead.sizes``)."""
    model, dtype, layout = placed.model, batch.dtype, placed.layout
    weights = weight_tensors(model, dtype, layout.lora_rank)
    # what ZeRO-3 gathers: QLoRA's codes as DeepSpeed holds them
    gathered = weight_tensors(model, dtype, layout.lora_rank, layout.quantization, layout.zero_stage)
    layers = checkpointed_activation_tensors if layout.gradient_checkpointing else activation_tensors
    head_sizes = batch.head.sizes() if batch.head is not None else None
    forward = layer_forward_program(model, batch.sequences, batch.seq_len, dtype, batch.attn_impl, batch.coef)
    # the traced layer's own forward: as the forward runs it, or checkpointed as the backward's recompute does
    program = () if layout.lora_rank else recompute_program(forward) if layout.gradient_checkpointing else forward
    if not layout.lora_rank:  # the layer's backward, after the recompute where checkpointed
        program += layer_backward_program(model, batch.sequences, batch.seq_len, dtype, batch.attn_impl)
    return program + sizes_of(
        gradients=tuple(reversed(weights)),
        zero3_gathered=gathered[1:],
        activations=layers(model, batch.sequences, batch.seq_len, dtype, batch.attn_impl, batch.coef),
        logits=(
            head_sizes
            if head_sizes is not None
            else logit_tensors(model, batch.sequences, batch.seq_len, dtype, batch.loss)
        )
        if placed.lm_head
        else (),
        buffers=(placed.work.reduce_bucket,),
        # the named group FP16_Optimizer.step() makes without ZeRO: each gradient's fp32 upcast, in order
        **{FP32_UPCASTS: tuple(4 * size // DTYPE_BYTES[dtype] for size in weights)},
    )


@lru_cache(maxsize=1024)
def inference_sizes(
    model: ModelSpec, sequences: int, seq_len: int, dtype: str, attn_impl: str, coef: Coefficients, logit_tokens: int
) -> Sizes:
    """The live parts of a no-grad forward or a generate call (``logit_tokens`` tokens get logits). Cached: the
    RLHF search asks for the same few (model, batch) forwards at every one of its points (a PPO job's exhaustive
    walk: 83,000 calls for 4,608 points; cached, the walk takes 13% fewer CPU seconds)."""
    d = DTYPE_BYTES[dtype]
    elements = sequences * logit_tokens * model.vocab_size
    return sizes_of(
        zero3_gathered=weight_tensors(model, dtype)[1:],
        activations=activation_tensors(model, sequences, seq_len, dtype, attn_impl, coef),
        logits=(d * elements, 4 * elements),
    )


def resident_sizes(
    model: ModelSpec, dtype: str, lora_rank: int, *, flat: bool, quantization: str = "none"
) -> tuple[int, ...]:
    """A trained or frozen model's resident weights: tensor by tensor, or one flat buffer (ZeRO-1/2 without
    LoRA point every ``p.data`` into one flattened buffer per parameter group); QLoRA's as bitsandbytes holds them."""
    weights = weight_tensors(model, dtype, lora_rank, quantization)
    return (sum(weights),) if flat else weights
