"""The moments of one trained model's micro-step and optimizer step, and the bytes live at each.

A phase's peak allocated is the largest of a few moments, each the resident bytes plus what is live
then: the loss (fp32 copies of the logits), the top layer's backward, the last (embedding) gradient, the
gradient reduction's epilogue, the optimizer step's gradient copies. DeepSpeed's working buffers and when
they exist come from :func:`search.model.zero_buffers.zero_workspace`. Single-model training
(:mod:`search.single`) and the actor and critic of an RLHF step (:mod:`search.rlhf.memory`) both
count their training this way. ZeRO-3 on several ranks adds the gathered parameters its reuse distance
keeps across the forward-backward turn (:mod:`search.model.reuse`) to the moments around it. Checked
against CPU probes of tiny models at world sizes 1, 2 and 4 (``tests/probes/test_cost_model_accuracy.py``).
"""

from __future__ import annotations

from search.model.activations import Activations, LossLogits, tied_embedding_extra
from search.model.deepspeed_tensors import (
    offload_epilogue,
    offload_norm_upcasts,
    with_loss_tensors,
    zero0_moments,
    zero2_moments,
)
from search.model.micro_batch import MicroBatchContext
from search.model.moment_parts import (
    LIVE_PARTS,
    REDUCTION_STREAM,
    TRAINING_PHASES,
    Moment,
    NamedTensors,
    TrainingMoments,
    between_micro_steps,
    largest,
    moment,
    plus,
)
from search.model.reuse import zero3_reuse
from search.model.shapes import token_embedding_params, trainable_params
from search.model.turn import MicroStepTurn, PlacedModel
from search.model.zero3_step import zero3_offload_grads, zero3_step, zero3_sub_groups
from search.model.zero_buffers import ZERO3_NORM_CHUNK_ELEMENTS
from store.records import DTYPE_BYTES

__all__ = [
    "LIVE_PARTS",
    "TRAINING_PHASES",
    "Moment",
    "PlacedModel",
    "TrainingMoments",
    "between_micro_steps",
    "largest",
    "moment",
    "plus",
    "training_moments",
]


def training_moments(
    placed: PlacedModel, batch: MicroBatchContext, acts: Activations, logits: LossLogits
) -> TrainingMoments:
    """Forward, backward and optimizer-step moments of one micro-batch (``batch``: its dtype) of the trained model
    ``placed``, with the tensors DeepSpeed and transformers make by name where this layout's are known
    (:mod:`search.model.deepspeed_tensors`).

    ``acts.backward_working`` is the activation-gradient bytes of the layer being differentiated; ``logits``
    are zero for a model without an LM head (a reward model or a critic).
    """
    turn = _turn(placed, batch.dtype, acts, logits)
    work, zero_stage = placed.work, placed.layout.zero_stage
    accumulating, d = placed.grad_accum > 1, turn.d
    tied_at = 2 if turn.tied else 0
    if zero_stage == 0:
        moments = zero0_moments(placed, turn, logits)
        return with_loss_tensors(moments, logits, d, turn.head_weight, tied_at)
    if not work.norm_in_backward and (
        zero_stage == 2 or (zero_stage == 1 and work.comm_overlapped and not accumulating)
    ):
        # ZeRO-1 takes ZeRO-2's path where its gradient hooks reduce as they fire (overlap_comm; every micro-step
        # an accumulation boundary): reduce_ipg_grads copies its partition's gradients into grads_in_partition
        moments = zero2_moments(placed, turn, acts, logits)
        summed_at = len(moments.phases["backward"]) - 2 if turn.tied else 0  # the `end + inflight` moment
        return with_loss_tensors(moments, logits, d, turn.head_weight, summed_at)
    if zero_stage in (1, 2):
        step, named = _zero12_end(placed, turn, logits)
    else:
        step, named = _zero3_end(placed, turn, logits)
    phases = {"forward": turn.forward, "backward": turn.backward, "optimizer_step": step}
    moments = TrainingMoments(turn.base, turn.gathered_params, phases, named)
    return with_loss_tensors(moments, logits, d, turn.head_weight, tied_at)


def _turn(placed: PlacedModel, dtype: str, acts: Activations, logits: LossLogits) -> MicroStepTurn:
    """The forward and the loss's and top layer's backward of one micro-batch, and what they hold."""
    model, lm_head, states, work = placed.model, placed.lm_head, placed.states, placed.work
    layout, world_size = placed.layout, placed.world_size
    zero_stage, lora_rank, gradient_checkpointing = layout.zero_stage, layout.lora_rank, layout.gradient_checkpointing
    d = DTYPE_BYTES[dtype]
    zero3, accumulating = zero_stage == 3, placed.grad_accum > 1
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
    # the LM head's backward makes its weight's gradient (a tied one waits in autograd for the embedding's)
    head_weight = d * (model.lm_head_params or token_embedding_params(model)) if lm_head and not lora_rank else 0
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
            activations=acts.saved + acts.backward_working + recompute,
            logits=logits.held,
            zero3_gathered=at_layers,
        ),
    ]
    return MicroStepTurn(
        d=d,
        base=base,
        kept=kept,
        gathered_params=gathered_params,
        embedding_grad=embedding_grad,
        tied=tied,
        head_grad=head_grad,
        inflight=inflight,
        head_weight=head_weight,
        forward=forward,
        backward=backward,
    )


def _zero12_end(
    placed: PlacedModel, turn: MicroStepTurn, logits: LossLogits
) -> tuple[list[Moment], dict[str, list[NamedTensors]] | None]:
    """ZeRO-1/2 reducing at the backward's end (appended to ``turn.backward``): the optimizer step's moments and
    the named tensors of the offloaded epilogue."""
    model, lm_head, states, work = placed.model, placed.lm_head, placed.states, placed.work
    lora_rank, backward = placed.layout.lora_rank, turn.backward
    at_end = work.carried_grads if placed.layout.zero_stage == 2 else 0  # ZeRO-2: the previous micro-step's partition
    backward.append(moment(gradients=at_end + turn.inflight, buffers=work.backward_buckets, logits=logits.held))
    step = [turn.base]  # before the accumulation boundary engine.step() changes nothing
    if work.norm_in_backward:  # offload: each gradient's fp64 norm and fp32 copy at the backward's end
        trainable = trainable_params(model, lora_rank, lm_head=lm_head)
        upcasts = offload_norm_upcasts(model, lm_head, lora_rank, trainable, placed.world_size)
        ends, ends_named = offload_epilogue(upcasts, work, logits.held)
        named: dict[str, list[NamedTensors]] = {"backward": [()] * len(backward) + ends_named}
        backward += ends
        return step, named
    backward.append(moment(gradients=work.partition_grads, buffers=work.backward_buckets, logits=logits.held))
    copies = max(work.grad_norm, work.step_copies + states.step_transient)
    step.append(moment(gradients=work.partition_grads + copies))
    return step, None


def _zero3_end(
    placed: PlacedModel, turn: MicroStepTurn, logits: LossLogits
) -> tuple[list[Moment], dict[str, list[NamedTensors]]]:
    """ZeRO-3's last gradient and reduce-scatter (appended to ``turn.backward``), then its optimizer step sub-group
    by sub-group, or each offloaded partition's copies at the backward's end; with the tensors by name."""
    model, lm_head, states, work = placed.model, placed.lm_head, placed.states, placed.work
    lora_rank, world_size, backward, kept, d = (
        placed.layout.lora_rank,
        placed.world_size,
        turn.backward,
        turn.kept,
        turn.d,
    )
    embedding_params = turn.embedding_grad if turn.gathered_params else 0  # gathered for its own backward
    backward.append(moment(gradients=kept + turn.inflight, zero3_gathered=embedding_params, logits=logits.held))
    # reduce-scatter of the largest gradient: its flattened copy (stage3.py partition_grads)
    backward.append(moment(gradients=kept + max(work.reduce_copy, work.reduced), logits=logits.held))
    if work.norm_in_backward:  # offload: each partition's device copy, fp64 norm, fp32 copy (reduction stream)
        side = REDUCTION_STREAM if work.comm_overlapped else 0
        held_by = zero3_offload_grads(model, lm_head, lora_rank, world_size, d, ZERO3_NORM_CHUNK_ELEMENTS, side)
        named: dict[str, list[NamedTensors]] = {"backward": [()] * len(backward)}
        for tensors in held_by:
            held = sum(t.size for t in tensors)
            backward.append(moment(gradients=kept + work.reduced + held, logits=logits.held))
            named["backward"].append(tensors)
        return [turn.base], named
    # sub-group by sub-group (stage3.py step()), at the sub-group size the states were laid out with
    groups = zero3_sub_groups(model, lm_head, lora_rank, world_size, states.step_transient // (d + 4))
    step, step_named = zero3_step(kept, work.grad_norm, d, groups)
    return step, {"optimizer_step": step_named}
