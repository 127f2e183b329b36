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
from search.model.shapes import token_embedding_params
from search.model.states import ModelStates, ZeroWorkspace
from store.records import DTYPE_BYTES, ModelSpec

# The bytes live beside the resident ones at one moment, named as in the JSON breakdown (``buffers``:
# DeepSpeed's buckets that exist only for a while, such as ZeRO-1/2's reduce buckets during a backward).
LIVE_PARTS = ("gradients", "zero3_gathered", "activations", "logits", "buffers")
Moment = dict[str, int]
TRAINING_PHASES = ("forward", "backward", "optimizer_step")


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
        backward.append(moment(gradients=states.gradients + inflight, logits=logits.held))
        backward.append(moment(gradients=states.gradients + work.allreduce_copy, logits=logits.held))
        step = [moment(gradients=states.gradients + states.step_transient)]
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


def largest(moments: list[Moment]) -> Moment:
    """The moment with the most live bytes."""
    return max(moments, key=lambda parts: sum(parts.values()))
