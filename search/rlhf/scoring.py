"""Which scoring forwards an RLHF step runs, over how many sequences at once, and through which LM head.

memplan's own loop (DeepSpeed-Chat style) scores every generated batch with every model it holds: the actor's
old-policy log-probs, the critic's values, the reference's log-probs and the reward, one forward per generate
call over its ``generation_batch x samples_per_prompt`` sequences, with the ``(batch, seq, vocab)`` logits.

TRL 1.16's GRPOTrainer (trl/trainer/grpo_trainer.py) scores differently, and the plan follows it:

- **In micro-batches, through the fused head.** ``_generate_and_score_completions`` calls
  ``_get_per_token_logps_and_entropies(..., batch_size=batch_size)`` with ``batch_size =
  self.args.per_device_train_batch_size``: the generation batch goes through the model ``batch_size``
  sequences at a time, each with ``fused_lm_head=True`` (the policy and the reference are patched by
  ``add_fused_lm_head`` in ``__init__``). The head scores the completion tokens (``labels[:, :-logits_to_keep] =
  -100``) in tiles (:mod:`search.model.fused_head`): no ``(batch, seq, vocab)`` logits and no
  ``selective_log_softmax`` over them (TRL 1.16's GRPO no longer calls it). Under ``torch.no_grad()`` the head
  holds its forward only: the compact hidden copy, one projection tile and its fp32 vectors.
- **The old policy only when needed**: :func:`store.frameworks.scores_old_policy`.
- **The reference of a LoRA actor is the actor with its adapters off**:
  :func:`store.frameworks.reference_through_actor`; the pass runs through the actor's placement (its weights,
  its ZeRO gathers) and its time is the actor's.
"""

from __future__ import annotations

from search.model.fused_head import FusedHead, scored_tokens, trl_fused_head
from search.model.placement import FrozenPlacement, TrainedPlacement
from search.rlhf.job import RLHFContext
from search.rlhf.models import Models
from store.frameworks import reference_through_actor, scores_old_policy, trl_grpo

# TRL 1.16 patches the policy with outputs=("log_probs", "entropy") and the reference copy with the default
# ("log_probs",) (GRPOTrainer.__init__, add_fused_lm_head); a LoRA actor's reference pass runs the policy's head
POLICY_OUTPUTS: tuple[str, ...] = ("log_probs", "entropy")
REFERENCE_OUTPUTS: tuple[str, ...] = ("log_probs",)

Scorer = tuple[str, TrainedPlacement | FrozenPlacement]


def trl_scoring(ctx: RLHFContext) -> bool:
    """Whether the step is TRL's GRPOTrainer, which scores in micro-batches through its fused head."""
    return trl_grpo(ctx.workload.framework, ctx.workload.kind)


def scoring_chunks(ctx: RLHFContext, generation_batch: int, micro_batch: int) -> tuple[int, int]:
    """(sequences per scoring forward, forwards per step) of each scoring model: TRL's ``batch_size =
    per_device_train_batch_size`` chunks over the step's sequences, else one forward per generate call."""
    job = ctx.job
    if trl_scoring(ctx):
        return micro_batch, job.sequences_per_gpu // micro_batch
    return generation_batch * job.samples_per_prompt, job.prompts_per_gpu // generation_batch


def scoring_head(ctx: RLHFContext, model: TrainedPlacement | FrozenPlacement, sequences: int) -> FusedHead | None:
    """TRL's fused head of one no-grad scoring forward over ``sequences`` sequences, or None: the program computes
    the logits (any other framework; a scalar head). A frozen LM is the reference copy, patched with the default
    outputs; the actor (old policy, or the reference with its adapters off) runs the policy's."""
    if not trl_scoring(ctx) or not model.lm_head:
        return None
    w = ctx.workload
    tokens = scored_tokens(w.kind, sequences, ctx.job.seq_len, w.gen_len)
    outputs = REFERENCE_OUTPUTS if isinstance(model, FrozenPlacement) else POLICY_OUTPUTS
    return trl_fused_head(model.model, tokens, w.dtype, head_trainable=False, outputs=outputs)


def scores_actor(ctx: RLHFContext, grad_accum: int, rollout_engine: bool) -> bool:
    """Whether the actor's old-policy scoring forward runs (:func:`store.frameworks.scores_old_policy`)."""
    w = ctx.workload
    return scores_old_policy(w.framework, w.kind, w.ppo_epochs, grad_accum, rollout_engine)


def reference_is_actor(ctx: RLHFContext, lora_rank: int) -> bool:
    """Whether the reference pass runs through the LoRA actor (:func:`store.frameworks.reference_through_actor`)."""
    w = ctx.workload
    return reference_through_actor(w.framework, w.kind, w.holds_reference, lora_rank)


def reference_may_be_actor(ctx: RLHFContext) -> bool:
    """Whether the reference pass may run through the actor, whatever its LoRA rank: the search's per-model bounds
    (:mod:`search.choose.rlhf_space`) then count no reference copy, nor its forward (they stay lower bounds)."""
    return reference_is_actor(ctx, 1)


def scorers(ctx: RLHFContext, models: Models, grad_accum: int, rollout_engine: bool) -> list[Scorer]:
    """The scoring forwards of one step, in the order they run: (role, the placement that runs it)."""
    found: list[Scorer] = []
    if scores_actor(ctx, grad_accum, rollout_engine):
        found.append(("actor", models.actor))
    if models.critic is not None:
        found.append(("critic", models.critic))
    if models.reference is not None:
        found.append(("reference", models.reference))
    elif reference_is_actor(ctx, models.actor.layout.lora_rank):
        found.append(("reference", models.actor))
    if models.reward is not None:
        found.append(("reward", models.reward))
    return found
