"""DeepSpeed's and transformers' own tensors in a trained model's moments, made and freed as their code does.

The cost model's moments hold bytes per live part; the allocation stream (:mod:`search.streams`) makes a
part's bytes in its pattern of sizes, last made first freed. Where the code makes one tensor and frees
others around it (ZeRO-2's gradient partition, the optimizer step's copies, the loss's fp32 tensors) the
moments name those tensors (:class:`search.model.moment_parts.Named`), read from ``stage_1_and_2.py``,
``fused_optimizer.py`` and transformers' ``ForCausalLMLoss``.
"""

from __future__ import annotations

from collections.abc import Iterable

from search.model.activations import Activations, LossLogits
from search.model.moment_parts import (
    ALLREDUCE_FLAT,
    FLAT_GRADS,
    FP32_FLAT,
    FP32_GRADS,
    FP32_UPCASTS,
    GRAD_NORM,
    GRAD_PARTITION,
    LOG_SOFTMAX,
    LOG_SOFTMAX_GRAD,
    LOGITS,
    LOGITS_FP32,
    NLL_GRAD,
    REDUCTION_STREAM,
    Moment,
    Named,
    NamedTensors,
    TrainingMoments,
    moment,
)
from search.model.shapes import largest_trainable_tensor, lora_params, token_embedding_params
from search.model.turn import MicroStepTurn, PlacedModel
from search.model.zero_buffers import ZeroWorkspace
from store.records import ModelSpec

FP64 = 8  # bytes of a norm's upcast element (get_norm_dtype(): torch.float64)


LOGITS_GRAD, HEAD_GRAD = "logits_grad", "head_grad"  # the 16-bit logits' gradient; the LM head weight's
EMBEDDING_GRAD, EMBEDDING_SUM = "embedding_grad", "embedding_sum"  # a tied weight's own gradient; the sum


def loss_tensors(
    logits: LossLogits, d: int, head_grad: int = 0
) -> tuple[list[NamedTensors], list[NamedTensors], Named | None]:
    """transformers' cross-entropy and the LM head's backward, tensor by tensor, per moment in step order.
    Forward (``ForCausalLMLoss``): the head's 16-bit logits, ``logits.float()``'s fp32 upcast, ``F.cross_entropy``'s
    fp32 log-softmax (its autograd node saves its output); the upcast goes when the loss returns, the 16-bit
    logits when the loop drops the model output: the log-softmax is left. Backward, node by node:
    ``NllLossBackward`` makes a zero fp32 gradient, ``LogSoftmaxBackward`` the fp32 gradient of its input, then
    its input gradient and saved output go; ``ToCopyBackward`` (``.float()``) casts it to the 16-bit dtype and
    the fp32 one goes (fp32 training: no copy); the head's ``MmBackward`` makes the weight's gradient
    (``head_grad`` bytes; 0 frozen) beside the 16-bit one, which goes as the decoder's backward starts. The
    16-bit logits a loop holds (``held``) stay throughout."""
    e = logits.cross_entropy_elements
    held = Named("logits", LOGITS, logits.held) if logits.held else None
    kept = (held,) if held else ()
    lsm, nll, lsm_grad = (Named("logits", name, 4 * e) for name in (LOG_SOFTMAX, NLL_GRAD, LOG_SOFTMAX_GRAD))
    upcast = (Named("logits", LOGITS_FP32, 4 * e),) if d != 4 else ()
    grad16 = (Named("logits", LOGITS_GRAD, d * e),) if d != 4 else ()
    weight = (Named("gradients", HEAD_GRAD, head_grad),) if head_grad else ()
    forward = [(Named("logits", LOGITS, d * e), *upcast, lsm), (*kept, lsm)]
    backward = [(*kept, lsm, nll), (*kept, lsm, nll, lsm_grad)]
    if grad16:
        backward.append((*kept, lsm_grad, *grad16))
    backward.append((*kept, *(grad16 or (lsm_grad,)), *weight))
    return forward, backward, held


def _holding(at: Moment, tensors: NamedTensors, peak: bool) -> Moment:
    """``at`` holding ``tensors``: at the peak its bytes (the tensors' where more), else the tensors' logits."""
    logits, grads = (sum(t.size for t in tensors if t.part == part) for part in ("logits", "gradients"))
    if peak:
        return {**at, "logits": max(at["logits"], logits)}
    return {**at, "logits": logits, "gradients": at["gradients"] + grads}


def with_loss_tensors(
    moments: TrainingMoments, logits: LossLogits, d: int, head_grad: int = 0, summed_at: int = 0
) -> TrainingMoments:
    """``moments`` with the loss's moments made tensor by tensor (:func:`loss_tensors`) around its forward and
    backward peaks. The head weight's gradient stays named up to the backward's moment ``summed_at`` where they
    hold it (a tied weight's: autograd keeps it until the embedding's backward sums it with its own; 0: only in
    the head's backward). Unchanged where the loss is not transformers' cross-entropy."""
    if not logits.cross_entropy_elements:
        return moments
    at_forward, at_backward, held = loss_tensors(logits, d, head_grad)
    phases = {phase: list(at) for phase, at in moments.phases.items()}
    named = {phase: list(moments.named_of(phase)) for phase in moments.phases}

    def split(phase: str, k: int, sequence: list[NamedTensors], peak: int) -> None:
        at, own = phases[phase][k], named[phase][k]
        phases[phase][k : k + 1] = [_holding(at, tensors, i == peak) for i, tensors in enumerate(sequence)]
        named[phase][k : k + 1] = [(*own, *tensors) for tensors in sequence]

    if len(phases["forward"]) > 1:
        split("forward", 1, at_forward, 0)
    backward, start = phases["backward"], len(at_backward)  # start: the top layer's backward
    if backward:
        split("backward", 0, at_backward, 1)
    for k in range(start, len(backward)):
        if held is not None and backward[k]["logits"] >= held.size:
            named["backward"][k] = (*named["backward"][k], held)
    for k in range(start, min(start + summed_at, len(backward)) if head_grad else 0):
        grads = sum(t.size for t in named["backward"][k] if t.part == "gradients")
        free = backward[k]["gradients"] - max(moments.base["gradients"], grads)
        # the embedding's backward: its dense gradient, then the sum with the head's, beside it
        summed = (EMBEDDING_GRAD, EMBEDDING_SUM) if k == start + summed_at - 1 and free >= 3 * head_grad else ()
        if free < head_grad:
            break
        named["backward"][k] += tuple(Named("gradients", n, head_grad) for n in (HEAD_GRAD, *summed))
    return TrainingMoments(moments.base, moments.gathered_params, phases, named)


def first_flush_layers(model: ModelSpec, lm_head: bool, lora_rank: int, bucket_elements: int) -> int | None:
    """Decoder layers whose backward is done when ZeRO-2 first flushes a full reduce bucket, the moment
    ``copy_grads_in_partition`` makes ``grads_in_partition``; None when it is made at the backward's end.

    The backward reaches gradients in reverse load order (an untied LM head, the final norm, the layers top
    down, the token embedding); ``reduce_independent_p_g_buckets_and_remove_grads`` reduces the bucket when
    the next gradient would overflow it. A gradient larger than the bucket bypasses it until that flush.
    """
    if bucket_elements <= 0:
        return None
    per_layer = lora_params(model, lora_rank) // model.num_layers if lora_rank else model.layer_params
    head = model.lm_head_params if lm_head and not lora_rank else 0
    before = (0 if lora_rank else model.hidden_size) + (head if head <= bucket_elements else 0)
    if per_layer <= 0 or before + model.num_layers * per_layer <= bucket_elements:
        return None
    return max(0, bucket_elements - before) // per_layer


def zero0_moments(placed: PlacedModel, turn: MicroStepTurn, logits: LossLogits) -> TrainingMoments:
    """No ZeRO, tensor by tensor: the 16-bit ``param.grad`` stay from the backward to step(); the allreduce's
    flattened copy lives at the backward's end; FP16_Optimizer.step() (bf16 too) upcasts each gradient to
    fp32 (a tensor per parameter, the ``fp32_upcasts`` sizes of ``search.streams.sizes.training_sizes``), flattens
    those into one fp32 gradient, then drops the upcasts and the 16-bit gradients before Adam runs."""
    states, work, base, gathered_params = placed.states, placed.work, turn.base, turn.gathered_params
    forward, backward, inflight = turn.forward, turn.backward, turn.inflight
    grads = states.gradients
    backward.append(moment(gradients=grads + inflight, logits=logits.held))
    backward.append(moment(gradients=grads + work.allreduce_copy, logits=logits.held))
    upcasts = states.step_transient // 2
    flat = states.step_transient - upcasts
    step = [
        moment(gradients=grads),
        moment(gradients=grads + upcasts),
        moment(gradients=grads + upcasts + flat),
        moment(gradients=flat),
    ]
    up, flattened = Named("gradients", FP32_UPCASTS, upcasts), Named("gradients", FP32_FLAT, flat)
    return TrainingMoments(
        base=base,
        gathered_params=gathered_params,
        phases={"forward": forward, "backward": backward, "optimizer_step": step},
        named={
            "forward": [()] * len(forward),
            "backward": [()] * (len(backward) - 1) + [(Named("gradients", ALLREDUCE_FLAT, work.allreduce_copy),)],
            "optimizer_step": [(), (up,), (up, flattened), (flattened,)],
        },
    )


def zero2_moments(placed: PlacedModel, turn: MicroStepTurn, acts: Activations, logits: LossLogits) -> TrainingMoments:
    """ZeRO-2 without offload (and ZeRO-1 reducing as its hooks fire), tensor by tensor as stage_1_and_2.py makes
    them: ``grads_in_partition`` from the first bucket flush (:func:`first_flush_layers`) or, accumulating, from
    the first micro-step on, to step() (made at the backward's end, beside a tied embedding's summed gradient
    larger than a bucket: ``extra_large_param_to_reduce`` keeps it until the copy); step() takes each gradient's
    fp64 norm, flattens the partition, upcasts it to fp32 and frees the 16-bit two before Adam runs on the fp32."""
    model, lm_head, lora_rank = placed.model, placed.lm_head, placed.layout.lora_rank
    accumulating, states, work = placed.grad_accum > 1, placed.states, placed.work
    base, gathered_params, forward, backward = turn.base, turn.gathered_params, turn.forward, turn.backward
    inflight, d = turn.inflight, turn.d
    partition = work.partition_grads
    flush = first_flush_layers(model, lm_head, lora_rank, work.reduce_bucket // d)
    made_early = accumulating or flush is not None
    # copy_grads_in_partition runs under reduce_ipg_grads' stream: the reduction stream with overlap_comm
    side = REDUCTION_STREAM if work.comm_overlapped else 0
    held: NamedTensors = (Named("gradients", GRAD_PARTITION, partition, side),)
    carried = held if accumulating else ()
    named_backward = [carried, carried]
    if flush is not None and flush < model.num_layers:
        remaining = acts.saved * (model.num_layers - flush) // model.num_layers
        backward.append(
            moment(
                gradients=partition + backward[1]["gradients"] - base["gradients"],
                buffers=work.backward_buckets,
                activations=remaining,
                logits=logits.held,
            )
        )
        named_backward.append(held)
    end = partition if made_early else 0
    tied = d * token_embedding_params(model) if lm_head and model.tie_word_embeddings and not lora_rank else 0
    summed = tied if tied > work.reduce_bucket and not made_early else 0
    backward.append(moment(gradients=end + inflight, buffers=work.backward_buckets, logits=logits.held))
    backward.append(moment(gradients=partition + summed, buffers=work.backward_buckets, logits=logits.held))
    last = (Named("gradients", EMBEDDING_SUM, summed),) if summed else ()
    named_backward += [held if made_early else (), (*held, *last)]
    norm, flat, fp32 = work.grad_norm, work.step_copies, states.step_transient
    step = [
        moment(gradients=partition),
        moment(gradients=partition + norm),
        moment(gradients=partition + flat),
        moment(gradients=partition + flat + fp32),
        moment(gradients=fp32),
    ]
    named_step: list[NamedTensors] = [
        held,
        (*held, Named("gradients", GRAD_NORM, norm)),
        (*held, Named("gradients", FLAT_GRADS, flat)),
        (*held, Named("gradients", FLAT_GRADS, flat), Named("gradients", FP32_GRADS, fp32)),
        (Named("gradients", FP32_GRADS, fp32),),
    ]
    return TrainingMoments(
        base=base,
        gathered_params=gathered_params,
        phases={"forward": forward, "backward": backward, "optimizer_step": step},
        named={"forward": [carried] * len(forward), "backward": named_backward, "optimizer_step": named_step},
    )


def offload_norm_upcasts(
    model: ModelSpec, lm_head: bool, lora_rank: int, trainable: int, world_size: int
) -> tuple[int, ...]:
    """ZeRO-1/2 with offload, the backward's end: ``set_norm_for_param_grad_in_gpu`` upcasts each gradient piece
    of the partition to fp64 for its norm (then ``async_inplace_copy_grad_to_fp32_buffer_from_gpu`` its fp32
    copy, inside the freed block), one at a time in the order the backward reduces them: an untied LM head
    first, the layers top down, the token embedding last. Each fp64 piece larger than every one before it
    needs a block of its own; those are the bytes returned, in order (the last is the largest)."""
    piece = -(-trainable // world_size)
    return _growing(FP64 * min(elements, piece) for elements in _reduction_order(model, lm_head, lora_rank))


def _reduction_order(model: ModelSpec, lm_head: bool, lora_rank: int) -> list[int]:
    """Elements of the gradients a backward reduces, as far as their sizes go up: an untied LM head first, a
    layer's largest weight, the token embedding last; with LoRA, its largest adapter."""
    if lora_rank:
        return [largest_trainable_tensor(model, lora_rank, lm_head=lm_head)]
    head = [model.lm_head_params] if lm_head and model.lm_head_params else []
    return [*head, model.hidden_size * model.intermediate_size, token_embedding_params(model)]


def _growing(sizes: Iterable[int]) -> tuple[int, ...]:
    """The sizes that each need a block larger than every one before them, in order."""
    out: list[int] = []
    for size in sizes:
        if not out or size > out[-1]:
            out.append(size)
    return tuple(out)


def offload_epilogue(
    upcasts: tuple[int, ...], work: ZeroWorkspace, held_logits: int
) -> tuple[list[Moment], list[NamedTensors]]:
    """The moments of an offloaded ZeRO-1/2 backward's end, one per fp64 norm upcast of
    :func:`offload_norm_upcasts` (the reduction stream's under ``overlap_comm``), beside the reduce buckets."""
    side = REDUCTION_STREAM if work.comm_overlapped else 0
    moments = [moment(gradients=size, buffers=work.backward_buckets, logits=held_logits) for size in upcasts]
    named: list[NamedTensors] = [
        (Named("gradients", f"{GRAD_NORM}_{i}", size, side),) for i, size in enumerate(upcasts)
    ]
    return moments, named


def zero3_offload_upcasts(
    model: ModelSpec, lm_head: bool, lora_rank: int, world_size: int, chunk_elements: int
) -> tuple[int, ...]:
    """ZeRO-3 with offload: as each bucket's gradient partitions reach ``_offload_grad_partition_at_boundary``,
    ``_constant_buffered_norm2`` upcasts each partition to fp64 in chunks of at most ``chunk_elements``, then
    the fp32 copy for the host lands in the freed block; in the backward's order (an untied LM head, the
    layers top down, the token embedding last). The fp64 sizes that each need a larger block, in order."""
    order = _reduction_order(model, lm_head, lora_rank)
    return _growing(FP64 * min(-(-elements // world_size), chunk_elements) for elements in order)
