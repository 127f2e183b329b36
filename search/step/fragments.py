"""Fragments: what torch's caching allocator keeps reserved beyond the live bytes (arXiv 2410.15651).

Each phase fragments a share of what it allocates and frees (``frag_within_step``) and leaves a share cached
for the phases after it (``frag_inference_carried`` after inference phases, ``frag_carried`` after training)
until an ``empty_cache`` call releases it; where the calls go is the one table of :mod:`store.phases`.
Within a repeated group (generate calls; interleaved micro-steps) a phase also follows its group's others.
"""

from __future__ import annotations

from functools import lru_cache

from search.coefficients import Coefficients
from search.model.timing import empty_cache_time
from search.streams.phases import StepPhase
from store.phases import END_STEP, empties_after

Structure = tuple[tuple[str, str, bool], ...]  # (name, group, group repeated within a step) per phase


def _survives(structure: Structure, q: int, p: int, policy: str) -> bool:
    """Do fragments left by phase ``q`` remain when phase ``p`` starts (no empty_cache in between)?"""
    m = len(structure)
    # along the step, wrapping into the next step (where every-step releases)
    path = [(q + i) % m for i in range((p - q) % m)]
    if not any(empties_after(policy, structure[k][0]) for k in path) and not (
        p <= q and empties_after(policy, END_STEP)
    ):
        return True
    # inside a repeated loop (several generate calls; interleaved micro-steps) p also follows q directly
    group, repeated = structure[q][1], structure[q][2]
    if structure[p][1] != group or not repeated:
        return False
    members = [k for k in range(m) if structure[k][1] == group]
    a, b = members.index(q), members.index(p)
    inner = [members[(a + i) % len(members)] for i in range((b - a) % len(members))]
    return not any(empties_after(policy, structure[k][0]) for k in inner)


@lru_cache(maxsize=512)
def release_plan(
    structure: Structure, policy: str
) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, tuple[int, ...]], ...]]:
    """For each phase the other phases whose fragments it still finds; for each phase followed by an
    ``empty_cache`` call, the phases whose cached blocks that call returns (itself included)."""
    m = len(structure)
    sees = tuple(tuple(q for q in range(m) if q != p and _survives(structure, q, p, policy)) for p in range(m))
    releases = tuple((p, (p, *sees[p])) for p in range(m) if empties_after(policy, structure[p][0]))
    return sees, releases


def _cut_at_fresh(sees: tuple[tuple[int, ...], ...], fresh: tuple[bool, ...]) -> tuple[tuple[int, ...], ...]:
    """``sees`` without what a fresh phase's cache emptying released: phase p no longer finds phase q when a
    fresh phase lies after q and up to p along the step (wrapping into the next step)."""
    m = len(fresh)

    def released(q: int, p: int) -> bool:
        return any(fresh[(q + i) % m] for i in range(1, (p - q) % m + 1 if p != q else m + 1))

    return tuple(tuple(q for q in seen if not released(q, p)) for p, seen in enumerate(sees))


def apply_policy(
    phases: tuple[StepPhase, ...],
    structure: Structure,
    resident: int,
    empty_cache: str,
    allocator: str,
    coef: Coefficients,
    init_cached: int = 0,
) -> tuple[list[int], list[int], float, list[int]]:
    """(reserved, index of the moment setting its own need) per phase, the seconds of the empty_cache calls,
    and each phase's own need (what it would reserve if no earlier phase had reserved more).

    A phase's own need is resident + the moment's live bytes + its within-phase fragments + the fragments
    other phases left that no ``empty_cache`` call has released since (``release_plan``) + what is left of
    ``init_cached`` (blocks DeepSpeed's init freed, which only the moment's activations reuse). Then the
    caching allocator's one rule across phases: it returns nothing to the device until ``empty_cache``
    (CUDACachingAllocator.cpp: segments are freed only by release_cached_blocks), so a phase reserves at
    least what every phase it follows without a call in between reserved. A ``fresh`` phase follows a call
    whatever the policy (what came before it is released), and a rollout engine's bytes are the engine's, not
    the trainer's allocator's: they count in their phase only.
    """
    sees, releases = release_plan(structure, empty_cache)
    if any(phase.fresh for phase in phases):
        sees = _cut_at_fresh(sees, tuple(phase.fresh for phase in phases))
    scale = coef.frag_expandable_factor if allocator == "expandable-segments" else 1.0
    residue = [scale * ph.factor * ph.carry * ph.transient for ph in phases]
    within = scale * coef.frag_within_step
    reserved, chosen = [], []
    for p, phase in enumerate(phases):
        carried = sum(residue[q] for q in sees[p])
        share = within * phase.factor
        best, best_live, best_k = -1, -1, 0
        for k, (live, transient) in enumerate(phase.moment_bytes):
            unreused = 0 if phase.fresh else max(0, init_cached - phase.moment_activations[k])
            total = resident + live + int(share * transient + carried) + unreused
            if total > best or (total == best and live > best_live):
                best, best_live, best_k = total, live, k
        reserved.append(best)
        chosen.append(best_k)
    own = list(reserved)
    engine = [phase.engine_bytes[k] for phase, k in zip(phases, chosen, strict=True)]
    reserved = [total - outside for total, outside in zip(reserved, engine, strict=True)]  # the trainer's own
    for _ in range(len(phases)):  # reserved only grows until a call: the closure over ``sees``
        changed = False
        for p, seen in enumerate(sees):
            for q in seen:
                if reserved[q] > reserved[p]:
                    reserved[p], changed = reserved[q], True
        if not changed:
            break
    reserved = [total + outside for total, outside in zip(reserved, engine, strict=True)]
    # each empty_cache call costs the release and, later, the cudaMalloc of what it released
    cache_seconds = 0.0
    for p, cached in releases:
        cache_seconds += empty_cache_time(phases[p].count, max(phases[q].transient for q in cached), coef)
    if empties_after(empty_cache, END_STEP):
        cache_seconds += empty_cache_time(1, max(phase.transient for phase in phases), coef)
    return reserved, chosen, cache_seconds, own
