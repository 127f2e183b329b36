"""The moments of one trained model's micro-step and optimizer step, and the bytes live at each.

A phase's peak allocated is the largest of a few moments, each the resident bytes plus what is live
then: the loss (fp32 copies of the logits), the top layer's backward, the last (embedding) gradient, the
gradient reduction's epilogue, the optimizer step's gradient copies. DeepSpeed's working buffers and when
they exist come from :func:`search.model.states.zero_workspace`. Single-model training
(:mod:`search.single`) and the actor and critic of an RLHF step (:mod:`search.rlhf.memory`) both
count their training this way. ZeRO-3 on several ranks adds the gathered parameters its reuse distance
keeps across the forward-backward turn (:mod:`search.model.reuse`) to the moments around it. Checked
against CPU probes of tiny models at world sizes 1, 2 and 4 (``tests/probes/test_cost_model_accuracy.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from search.model.activations import Activations, LossLogits, tied_embedding_extra
from search.model.reuse import zero3_reuse
from search.model.shapes import lora_params, token_embedding_params
from search.model.states import ModelStates, ZeroWorkspace
from store.records import DTYPE_BYTES, ModelSpec

# The bytes live beside the resident ones at one moment, named as in the JSON breakdown (``buffers``:
# DeepSpeed's buckets that exist only for a while, such as ZeRO-1/2's reduce buckets during a backward).
LIVE_PARTS = ("gradients", "zero3_gathered", "activations", "logits", "buffers")
Moment = dict[str, int]
TRAINING_PHASES = ("forward", "backward", "optimizer_step")


@dataclass(frozen=True)
class Named:
    """A tensor a moment holds by name, in a live part: the allocation stream (:mod:`search.streams`) makes
    it once and frees it when a later moment no longer names it, in whatever order that is (the rest of a
    part's bytes come and go last made, first freed). ``stream``: the CUDA stream it is allocated on (0 the
    default; 1 a side stream, whose blocks torch's allocator keeps in a pool of their own)."""

    part: str
    name: str
    size: int
    stream: int = 0


NamedTensors = tuple[Named, ...]
REDUCTION_STREAM = 1  # DeepSpeed's reduction_stream (ZeRO-1/2 with overlap_comm on a device with streams)
# ZeRO-2's gradient tensors (stage_1_and_2.py): grads_in_partition, made at the first reduce-bucket flush
# and kept to step(); get_grad_norm_direct's fp64 upcast of one gradient; the flattened 16-bit partition
# and its fp32 upcast (single_grad_partition), which step() makes, then frees the first two before Adam.
GRAD_PARTITION, GRAD_NORM, FLAT_GRADS, FP32_GRADS = "grad_partition", "grad_norm", "flat_grads", "fp32_grads"
# Without ZeRO: the engine's allreduce flattens the 16-bit gradients (one bucket) after a boundary backward;
# FP16_Optimizer.step() upcasts each 16-bit gradient to fp32 (a group of tensors, one per parameter) and
# flattens those into one fp32 gradient (fused_optimizer.py).
ALLREDUCE_FLAT, FP32_UPCASTS, FP32_FLAT = "allreduce_flat", "fp32_upcasts", "fp32_flat"


def moment(**parts: int) -> Moment:
    """The bytes live beside the resident ones at one moment of a phase (every LIVE_PARTS name present)."""
    unknown = set(parts) - set(LIVE_PARTS)
    if unknown:
        raise ValueError(f"unknown live parts {sorted(unknown)}")
    return {name: int(parts.get(name, 0)) for name in LIVE_PARTS}


def plus(base: Moment, **parts: int) -> Moment:
    """``base`` with ``parts`` added."""
    extra = moment(**parts)
    return {name: base[name] + extra[name] for name in LIVE_PARTS}


def between_micro_steps(work: ZeroWorkspace) -> Moment:
    """What a trained model keeps alive between its micro-steps beyond the resident bytes: gradients
    accumulated over an optimizer step and, under ZeRO-1, the reduce buckets set up by its first backward."""
    return moment(gradients=work.carried_grads, buffers=work.backward_buckets if work.buckets_carried else 0)


@dataclass(frozen=True)
class TrainingMoments:
    """What one trained model adds to its resident bytes, moment by moment, per training phase."""

    base: Moment  # alive before a micro-step starts: carried gradients (and ZeRO-1's carried buckets)
    gathered_params: int  # ZeRO-3 parameters gathered for the running module (0 on one rank)
    phases: dict[str, list[Moment]]  # forward, backward, optimizer_step: the candidate peak moments
    named: dict[str, list[NamedTensors]] | None = None  # per phase and moment, the tensors held by name

    def named_of(self, phase: str) -> tuple[NamedTensors, ...]:
        """The named tensors of each moment of ``phase`` (empty where none are named)."""
        named = (self.named or {}).get(phase)
        return tuple(named) if named else tuple(() for _ in self.phases[phase])

    @property
    def steady(self) -> int:
        """Gradients alive between micro-steps: what is not allocated and freed within a step's phases."""
        return self.base["gradients"]

    @property
    def carried(self) -> int:
        """Every byte alive between micro-steps (the gradients and ZeRO-1's reduce buckets under accumulation)."""
        return sum(self.base.values())


def training_moments(
    *,
    model: ModelSpec,
    lm_head: bool,
    dtype: str,
    zero_stage: int,
    lora_rank: int,
    gradient_checkpointing: bool,
    grad_accum: int,
    world_size: int,
    states: ModelStates,
    work: ZeroWorkspace,
    acts: Activations,
    logits: LossLogits,
    backward_working: int,
) -> TrainingMoments:
    """Forward, backward and optimizer-step moments of one micro-batch of a trained model.

    ``backward_working`` is the activation-gradient bytes of the layer being differentiated; ``logits``
    are zero for a model without an LM head (a reward model or a critic).
    """
    d = DTYPE_BYTES[dtype]
    zero3, accumulating = zero_stage == 3, grad_accum > 1
    recompute = acts.recompute  # 0 where the traced checkpointed backward holds it
    kept = states.gradients if zero3 else 0  # ZeRO-3's gradient partition buffer lives from init on
    base = plus(between_micro_steps(work), gradients=kept)
    carried_buckets = base["buffers"]
    gathered_params = states.zero3_gathered // 2 if (zero3 and world_size > 1) else 0  # one rank never gathers
    # ZeRO-3 on several ranks keeps the last modules gathered across the forward-backward turn (reuse.py)
    reuse = zero3_reuse(model, lm_head, gradient_checkpointing, world_size if zero3 else 1, work.reuse_distance)
    at_layers, at_loss = max(gathered_params, d * reuse.through_layers), d * reuse.total
    # The last gradient of a backward is the token embedding's; a tied one is summed with the LM head's
    # contribution (kept since the head's backward) out of place. It is one tensor beside what is already
    # reduced (ZeRO-1/2 buckets, ZeRO-3 partitions) or beside the accumulated gradient (grad_accum > 1).
    embedding_grad = d * token_embedding_params(model) if lora_rank == 0 else 0
    tied = tied_embedding_extra(model, dtype, lora_rank, lm_head)
    if zero_stage == 0:
        own = 1 if accumulating else 0
        # param.grad of the LM head (or the tied weight's share waiting in autograd), and of the top layer
        head = model.lm_head_params or token_embedding_params(model)
        head_grad = (d * head if lm_head else 0) + d * model.layer_params if not lora_rank else 0
    else:
        own = 1 + (1 if zero_stage == 1 and accumulating else 0)
        head_grad = tied // 2
    inflight = own * embedding_grad + tied
    # A checkpointed layer's forward keeps nothing for backward (non-reentrant checkpoint packs holders):
    # only its working tensors exist beside the checkpoints, as in a no-grad forward.
    layer_forward = acts.checkpointed_forward if gradient_checkpointing else 0
    forward = [  # in step order: the last layer's forward, then the loss
        plus(base, activations=acts.saved + layer_forward, zero3_gathered=at_layers),
        plus(base, activations=acts.saved, logits=logits.forward, zero3_gathered=at_loss),
    ]
    backward = [
        plus(base, activations=acts.saved, logits=logits.backward, zero3_gathered=at_loss),  # the loss's backward
        plus(  # the top layer's backward: ZeRO-1/2 buckets set up, the LM head's weight gradient formed
            base,
            gradients=head_grad,
            buffers=work.backward_buckets - carried_buckets,
            activations=acts.saved + backward_working + recompute,
            logits=logits.held,
            zero3_gathered=at_layers,
        ),
    ]
    if zero_stage == 0:
        return _zero0_moments(states, work, logits, base, gathered_params, forward, backward, inflight)
    elif zero_stage == 2 and not work.norm_in_backward:
        return _zero2_moments(
            model, lm_head, lora_rank, accumulating, states, work, acts, logits, base, gathered_params, forward,
            backward, inflight, d,
        )  # fmt: skip
    elif zero_stage in (1, 2):
        at_end = work.carried_grads if zero_stage == 2 else 0  # ZeRO-2: the previous micro-step's partition
        epilogue = work.grad_norm if work.norm_in_backward else work.partition_grads
        backward.append(moment(gradients=at_end + inflight, buffers=work.backward_buckets, logits=logits.held))
        backward.append(moment(gradients=epilogue, buffers=work.backward_buckets, logits=logits.held))
        step = [base]  # before the accumulation boundary engine.step() changes nothing
        if not work.norm_in_backward:
            copies = max(work.grad_norm, work.step_copies + states.step_transient)
            step.append(moment(gradients=work.partition_grads + copies))
    else:
        embedding_params = embedding_grad if gathered_params else 0  # gathered for its own backward
        backward.append(moment(gradients=kept + inflight, zero3_gathered=embedding_params, logits=logits.held))
        # reduce-scatter of the largest gradient: its flattened copy, then (offload) its fp64 norm once the
        # full gradient is released (stage3.py partition_grads / _offload_grad_partition_at_boundary)
        reducing = max(work.reduce_copy, work.reduced + (work.grad_norm if work.norm_in_backward else 0))
        backward.append(moment(gradients=kept + reducing, logits=logits.held))
        step = [base]
        if not work.norm_in_backward:
            step.append(moment(gradients=kept + max(work.grad_norm, states.step_transient)))
    return TrainingMoments(
        base=base,
        gathered_params=gathered_params,
        phases={"forward": forward, "backward": backward, "optimizer_step": step},
    )


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


def _zero0_moments(
    states: ModelStates,
    work: ZeroWorkspace,
    logits: LossLogits,
    base: Moment,
    gathered_params: int,
    forward: list[Moment],
    backward: list[Moment],
    inflight: int,
) -> TrainingMoments:
    """No ZeRO, tensor by tensor: the 16-bit ``param.grad`` stay from the backward to step(); the allreduce's
    flattened copy lives at the backward's end; FP16_Optimizer.step() (bf16 too) upcasts each gradient to
    fp32 (a tensor per parameter, in the sizes ``search.streams.sizes.zero0_step_sizes`` gives), flattens
    those into one fp32 gradient, then drops the upcasts and the 16-bit gradients before Adam runs."""
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


def _zero2_moments(
    model: ModelSpec,
    lm_head: bool,
    lora_rank: int,
    accumulating: bool,
    states: ModelStates,
    work: ZeroWorkspace,
    acts: Activations,
    logits: LossLogits,
    base: Moment,
    gathered_params: int,
    forward: list[Moment],
    backward: list[Moment],
    inflight: int,
    d: int,
) -> TrainingMoments:
    """ZeRO-2 without offload, tensor by tensor as stage_1_and_2.py makes them: ``grads_in_partition`` from
    the first bucket flush (:func:`first_flush_layers`) or, accumulating, from the first micro-step on, to
    step(); step() takes each gradient's fp64 norm, flattens the partition, upcasts it to fp32 and frees the
    16-bit two before Adam runs on the fp32 one."""
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
    backward.append(moment(gradients=end + inflight, buffers=work.backward_buckets, logits=logits.held))
    backward.append(moment(gradients=partition, buffers=work.backward_buckets, logits=logits.held))
    named_backward += [held if made_early else (), held]
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


def largest(moments: list[Moment]) -> Moment:
    """The moment with the most live bytes."""
    return max(moments, key=lambda parts: sum(parts.values()))
