"""Apply a planned ``empty_cache`` policy inside your own RLHF (PPO) loop.

The planner's ``empty_cache`` knob says where ``torch.cuda.empty_cache()`` goes (docs/rlhf.md; the
fragmentation study arXiv 2410.15651 measured about 25% less memory for about 2% more time when the
cache is emptied after each inference phase). :class:`EmptyCachePolicy` puts the call exactly there::

    from planner.runtime import EmptyCachePolicy
    cache = EmptyCachePolicy(plan.strategy)          # or "after-inference", or the plan's JSON dict
    with cache.phase("generation"): seqs = actor.module.generate(prompts, use_cache=True)
    with cache.phase("scoring"): old_logp, ref_logp, reward, values = score(seqs)
    with cache.phase("actor_training"): actor.backward(actor_loss(seqs)); actor.step()
    with cache.phase("critic_training"): critic.backward(critic_loss(seqs)); critic.step()
    cache.end_step()

Phases are ``generation``, ``scoring`` (any inference pass: reference, reward, critic values, the
actor's old log-probs), ``actor_training`` and ``critic_training``. Where each policy empties the cache
(the one table of ``store.phases``, which the cost model and the probes read too):

================  =====================================================
never             nowhere
after-generation  at the end of ``generation``
after-inference   at the end of ``generation`` and of ``scoring``
after-phase       at the end of every phase
every-step        at ``end_step()`` (after the optimizer steps)
================  =====================================================

The call runs only when CUDA is available (torch is imported on first use, not with this module); on
a CPU it is a no-op. Either way every decision is recorded in :attr:`EmptyCachePolicy.calls`, so tests
and users can see what would happen on a GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, NamedTuple

from store.errors import InputError
from store.phases import EMPTY_CACHE_AFTER, END_STEP
from store.phases import PHASES as STEP_PHASES
from store.records import EMPTY_CACHE_POLICIES

__all__ = [
    "PHASES",
    "POLICY_TABLE",
    "CacheDecision",
    "EmptyCachePolicy",
    "causal_lm_hidden_states",
    "chunked_causal_lm_loss",
]


def chunked_causal_lm_loss(hidden_states: Any, lm_head: Any, labels: Any, vocab_size: int) -> Any:
    """A plan's ``loss: "chunked"`` in your own loop: HF's causal-LM loss over chunks of tokens, never the
    whole logits (see ``probes.model.chunked_loss``; imports torch on first use)."""
    from probes.model.chunked_loss import chunked_causal_lm_loss as chunked  # lazy on purpose: probes loads torch

    return chunked(hidden_states, lm_head, labels, vocab_size)


def causal_lm_hidden_states(model: Any, input_ids: Any) -> Any:
    """The final hidden states of a transformers causal LM, the input of :func:`chunked_causal_lm_loss`."""
    from probes.model.chunked_loss import causal_lm_hidden_states as hidden  # lazy on purpose: probes loads torch

    return hidden(model, input_ids)


PHASES: tuple[str, ...] = STEP_PHASES["ppo"]
# Events (phase ends, and the end of the step) after which each policy calls torch.cuda.empty_cache():
# the table of store.phases, on the events of an RLHF loop.
POLICY_TABLE: dict[str, frozenset[str]] = {
    policy: events & frozenset((*PHASES, END_STEP)) for policy, events in EMPTY_CACHE_AFTER.items()
}


class CacheDecision(NamedTuple):
    """One decision: the event (a phase name or ``"end_step"``) and whether the policy empties the cache.

    ``called`` is the policy's answer, on a GPU or not; ``executed`` says whether
    ``torch.cuda.empty_cache()`` (or the injected function) really ran.
    """

    event: str
    called: bool
    executed: bool = False


class EmptyCachePolicy:
    """Calls ``torch.cuda.empty_cache()`` where the planned policy says (see the module docstring).

    Args:
        policy: a policy name (``"after-inference"``), a strategy or plan dictionary with an
            ``"empty_cache"`` key (at the top or under ``"strategy"``), or an object with an
            ``empty_cache`` attribute (a ``Strategy`` / ``RLHFStrategy``) or a ``strategy`` attribute
            holding one of these.
        empty_fn: what to call instead of ``torch.cuda.empty_cache`` (for example DeepSpeed's
            ``get_accelerator().empty_cache``); when given it always runs, CUDA or not.

    Raises:
        InputError: the policy name is not one of the five, or none can be found in ``policy``.
    """

    def __init__(self, policy: str | Mapping[str, Any] | Any, empty_fn: Callable[[], None] | None = None) -> None:
        name = _policy_name(policy)
        if name not in POLICY_TABLE:
            raise InputError(f"empty_cache policy must be one of {', '.join(EMPTY_CACHE_POLICIES)}, not {name!r}")
        self.name: str = name
        self.calls: list[CacheDecision] = []
        self._empty_fn = empty_fn
        self._cuda: bool | None = None  # decided on first use: torch is imported lazily

    def __repr__(self) -> str:
        return f"EmptyCachePolicy({self.name!r}, calls={len(self.calls)})"

    def empties_after(self, event: str) -> bool:
        """Whether the policy empties the cache after ``event`` (a phase name or ``"end_step"``)."""
        _check_event(event)
        return event in POLICY_TABLE[self.name]

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Run the block as phase ``name``; on normal exit, empty the cache if the policy says so."""
        _check_event(name, phase_only=True)
        yield
        self.end_phase(name)

    def end_phase(self, name: str) -> bool:
        """Mark the end of phase ``name``; returns whether the policy emptied (or would empty) the cache."""
        _check_event(name, phase_only=True)
        return self._decide(name)

    def end_step(self) -> bool:
        """Mark the end of the whole step (after every ``engine.step()``); returns the policy's decision."""
        return self._decide(END_STEP)

    @property
    def executed(self) -> int:
        """How many times the cache was really emptied."""
        return sum(1 for decision in self.calls if decision.executed)

    def _decide(self, event: str) -> bool:
        called = event in POLICY_TABLE[self.name]
        executed = False
        if called:
            if self._empty_fn is not None:
                self._empty_fn()
                executed = True
            elif self._cuda_available():
                import torch

                torch.cuda.empty_cache()
                executed = True
        self.calls.append(CacheDecision(event, called, executed))
        return called

    def _cuda_available(self) -> bool:
        if self._cuda is None:
            try:
                import torch
            except ImportError:  # no torch: nothing to empty
                self._cuda = False
            else:
                self._cuda = bool(torch.cuda.is_available())
        return self._cuda


def _check_event(event: str, phase_only: bool = False) -> None:
    known = PHASES if phase_only else (*PHASES, END_STEP)
    if event not in known:
        raise InputError(f"unknown phase {event!r}; phases are {', '.join(known)}")


def _policy_name(policy: str | Mapping[str, Any] | Any) -> str:
    """The policy name inside a name, a strategy/plan dictionary or a strategy/plan object."""
    if isinstance(policy, str):
        return policy
    if isinstance(policy, Mapping):
        if "empty_cache" in policy:
            return _policy_name(policy["empty_cache"])
        if "strategy" in policy:
            return _policy_name(policy["strategy"])
        raise InputError('no "empty_cache" policy in the given dictionary (nor under its "strategy")')
    for attribute in ("empty_cache", "strategy"):
        value = getattr(policy, attribute, None)
        if value is not None:
            return _policy_name(value)
    raise InputError(f"cannot find an empty_cache policy in a {type(policy).__name__}")
