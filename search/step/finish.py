"""A plan's prediction: peak reserved bytes per phase from the allocator replay of its step.

:func:`finish_step` builds the step's allocation stream under the plan's ``empty_cache`` policy, replays it
through the port of torch's caching allocator (:func:`search.step.replayed.replay_step`) with the plan's
allocator setting, and reads each phase's peak reserved and inactive-split bytes and the ``empty_cache``
calls' seconds from it. The replay has no device limit: it gives what the step needs, so a plan that does
not fit says by how much (the search ranks the closest by that), and one that fits never depends on the
allocator's free-and-retry path. The fragment coefficients' figure (:func:`search.step.assemble.screen_step`,
what a search ranks its many inner choices with) stays beside it as ``screen_reserved_bytes``.
"""

from __future__ import annotations

from search.coefficients import Coefficients
from search.prediction import Prediction
from search.step.assemble import Step, assemble, score_step
from search.step.replayed import replay_step
from store.records import Hardware


def finish_step(step: Step, empty_cache: str, allocator: str, hardware: Hardware, coef: Coefficients) -> Prediction:
    """The replayed Prediction of ``step`` under an ``empty_cache`` policy and an allocator setting.

    The peak phase is, among the phases at the step's peak reserved bytes, the one with the most live bytes
    (reserved only grows between ``empty_cache`` calls: later phases find what it reserved); its breakdown is
    that of its largest moment, with ``fragmentation`` the rest of the replayed reserved bytes."""
    replayed = replay_step(step, empty_cache, allocator, coef)
    reserved = [phase.reserved for phase in replayed.phases]
    largest = [max(range(len(ph.moments)), key=lambda k: ph.moments[k].total) for ph in step.phases]
    screen, _ = score_step(step, empty_cache, allocator, coef)
    return assemble(
        step,
        reserved,
        largest,
        [phase.allocated for phase in replayed.phases],
        replayed.cache_seconds,
        hardware,
        coef,
        reserved_from="replay",
        inactive_split=[phase.inactive_split for phase in replayed.phases],
        screen_reserved=screen,
    )
