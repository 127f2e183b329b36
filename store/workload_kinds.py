"""What each workload kind implies: one table, read by the cost model (``search``), the probes and the planner.

No other module compares a workload kind with a string; each asks this table what the kind implies
(``traits(workload.kind).reference_forward``) or checks a kind against :data:`KINDS`.

====================  ===  ======  ===  ===  =====  ====
field                 sft  reward  dpo  ppo  remax  grpo
====================  ===  ======  ===  ===  =====  ====
rlhf                  .    .       .    x    x      x
scalar_head           .    x       .    .    .      .
causal_lm_loss        x    .       .    .    .      .
sequences_per_sample  1    2       2    1    1      1
reference_model       .    .       x    x    x      x
reference_forward     .    .       x    .    .      .
trains_critic         .    .       .    x    .      .
generates             .    .       .    x    x      x
greedy_baseline       .    .       .    .    x      .
group_samples         .    .       .    .    .      x
gae_advantages        .    .       .    x    .      .
clipped_ratio         .    .       .    x    .      x
kl_in_loss            .    .       .    .    .      x
====================  ===  ======  ===  ===  =====  ====

Each field is described on :class:`KindTraits` (x: true, .: false). The phases each kind's step runs are
``store.phases.PHASES``; the programs that run each kind are ``store.frameworks.WORKLOADS``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from store.errors import InputError

__all__ = ["KINDS", "KindTraits", "traits"]


@dataclass(frozen=True)
class KindTraits:
    """What one workload kind implies for the models it holds, the phases it runs and the losses it computes."""

    # RLHF: the actor generates rollouts that frozen models score, then trains on them (a sample is a prompt);
    # else one model trains on given sequences (a sample is a sequence or a preference pair)
    rlhf: bool
    # the trained model is a sequence classifier with a scalar (value) head, no LM head over the vocabulary (reward)
    scalar_head: bool
    # the loss is the causal LM's token cross-entropy over the logits (sft): a chunked loss can replace it, and the
    # Trainer keeps only the loss, not the model output, through the backward; other kinds' losses read the
    # log-probs or the scalar scores from the output
    causal_lm_loss: bool
    # sequences that one sample puts through the model: 2 for a preference pair (chosen and rejected)
    sequences_per_sample: int
    # a frozen reference model is held beside the trained one (dpo, and RLHF's KL penalty)
    reference_model: bool
    # the training step runs the reference model's no-grad forward as its own phase before the policy's (dpo)
    reference_forward: bool
    # a critic (value model) trains beside the actor (ppo; ReMax and GRPO drop it)
    trains_critic: bool
    # the step generates (a ``generation`` phase): the trained sequences are the actor's completions of prompts,
    # and only the completion is scored
    generates: bool
    # a second, greedy generate per prompt batch whose reward is the baseline of the sampled one's (remax)
    greedy_baseline: bool
    # each prompt gets the workload's ``samples_per_prompt`` completions, whose rewards are normalized within
    # the prompt's group (grpo)
    group_samples: bool
    # advantages by GAE over the critic's values: a Python loop over the generated positions (ppo)
    gae_advantages: bool
    # the actor's loss is PPO's clipped importance ratio (ppo, grpo); else plain REINFORCE (remax)
    clipped_ratio: bool
    # the KL penalty against the reference is a term of the actor's loss (grpo); else it is folded into the reward
    kl_in_loss: bool

    @property
    def generate_passes(self) -> int:
        """Generate calls per prompt batch: 0 without generation, 2 with ReMax's greedy baseline, else 1."""
        if not self.generates:
            return 0
        return 2 if self.greedy_baseline else 1


_SINGLE = KindTraits(
    rlhf=False,
    scalar_head=False,
    causal_lm_loss=False,
    sequences_per_sample=1,
    reference_model=False,
    reference_forward=False,
    trains_critic=False,
    generates=False,
    greedy_baseline=False,
    group_samples=False,
    gae_advantages=False,
    clipped_ratio=False,
    kl_in_loss=False,
)
_RLHF = KindTraits(
    rlhf=True,
    scalar_head=False,
    causal_lm_loss=False,
    sequences_per_sample=1,
    reference_model=True,
    reference_forward=False,
    trains_critic=False,
    generates=True,
    greedy_baseline=False,
    group_samples=False,
    gae_advantages=False,
    clipped_ratio=True,
    kl_in_loss=False,
)

# Single-model kinds first, then RLHF, as store.phases.PHASES lists them.
KINDS: dict[str, KindTraits] = {
    "sft": replace(_SINGLE, causal_lm_loss=True),
    "reward": replace(_SINGLE, scalar_head=True, sequences_per_sample=2),
    "dpo": replace(_SINGLE, sequences_per_sample=2, reference_model=True, reference_forward=True),
    "ppo": replace(_RLHF, trains_critic=True, gae_advantages=True),
    "remax": replace(_RLHF, greedy_baseline=True, clipped_ratio=False),
    "grpo": replace(_RLHF, group_samples=True, kl_in_loss=True),
}


def traits(kind: str) -> KindTraits:
    """What workload ``kind`` implies; InputError naming the known kinds when it is none of them."""
    found = KINDS.get(kind) if isinstance(kind, str) else None
    if found is None:
        raise InputError(f"unknown workload kind {kind!r}; kinds: {', '.join(KINDS)}")
    return found
