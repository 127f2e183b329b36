"""The phases of a training step and where each ``empty_cache`` policy calls ``torch.cuda.empty_cache()``.

One table, read by the cost model (``search``: which fragments each call releases), the probes (where the
child calls it) and ``planner.runtime.EmptyCachePolicy`` (where a user's loop calls it).

Phase names per workload kind, in the order a step runs them:

=========  ==========================================================
sft        forward, backward, optimizer_step
reward     forward, backward, optimizer_step
dpo        reference_forward, forward, backward, optimizer_step
ppo        generation, scoring, actor_training, critic_training
remax      generation, scoring, actor_training
grpo       generation, scoring, actor_training
=========  ==========================================================

Where each policy empties the cache (after the named phases, or at the end of the step):

================  =====================================================================
never             nowhere
after-generation  after ``generation``
after-inference   after every inference phase: ``generation``, ``scoring``, ``reference_forward``
after-phase       after every phase
every-step        at the end of the step (after the optimizer steps)
================  =====================================================================
"""

from __future__ import annotations

from store.choices import Phase, values
from store.records import EMPTY_CACHE_POLICIES
from store.workload_kinds import KINDS

__all__ = [
    "ALL_PHASES",
    "EMPTY_CACHE_AFTER",
    "EMPTY_CACHE_PLACEMENT",
    "END_STEP",
    "INFERENCE_PHASES",
    "PHASES",
    "empties_after",
]

PHASES: dict[str, tuple[str, ...]] = {
    "sft": ("forward", "backward", "optimizer_step"),
    "reward": ("forward", "backward", "optimizer_step"),
    "dpo": ("reference_forward", "forward", "backward", "optimizer_step"),
    "ppo": ("generation", "scoring", "actor_training", "critic_training"),
    "remax": ("generation", "scoring", "actor_training"),
    "grpo": ("generation", "scoring", "actor_training"),
}
if list(PHASES) != list(KINDS):  # pragma: no cover - a table edited in one place only
    raise RuntimeError("store.phases.PHASES must name every kind of store.workload_kinds.KINDS, in its order")
END_STEP = "end_step"
INFERENCE_PHASES: frozenset[str] = frozenset({"generation", "scoring", "reference_forward"})
ALL_PHASES: frozenset[str] = frozenset(values(Phase))
if {name for names in PHASES.values() for name in names} != ALL_PHASES:  # pragma: no cover - one table edited alone
    raise RuntimeError("store.phases.PHASES must run exactly the phases of store.choices.Phase")
EMPTY_CACHE_AFTER: dict[str, frozenset[str]] = {
    "never": frozenset(),
    "after-generation": frozenset({"generation"}),
    "after-inference": INFERENCE_PHASES,
    "after-phase": ALL_PHASES,
    "every-step": frozenset({END_STEP}),
}
if set(EMPTY_CACHE_AFTER) != set(EMPTY_CACHE_POLICIES):  # pragma: no cover - a table edited in one place only
    raise RuntimeError("store.phases.EMPTY_CACHE_AFTER must name every policy of store.records.EMPTY_CACHE_POLICIES")


# The same table in words, as the exported plan tells the user where to put the call.
EMPTY_CACHE_PLACEMENT: dict[str, str] = {
    "never": "do not call torch.cuda.empty_cache()",
    "after-generation": (
        "call torch.cuda.empty_cache() right after each generation (rollout) phase, before scoring and training"
    ),
    "after-inference": (
        "call torch.cuda.empty_cache() after every inference phase: generation, and the reference, reward "
        "and critic forward passes, before the training phase starts"
    ),
    "after-phase": (
        "call torch.cuda.empty_cache() at the end of every phase (generation, each inference pass, and "
        "each training phase)"
    ),
    "every-step": "call torch.cuda.empty_cache() after every optimizer step (after engine.step())",
}


def empties_after(policy: str, event: str) -> bool:
    """Whether ``policy`` calls ``torch.cuda.empty_cache()`` at the end of ``event`` (a phase or ``end_step``)."""
    return event in EMPTY_CACHE_AFTER[policy]
