"""A search's answer confirmed by the allocator replay: the plans it returns are those the replay says fit.

A search meets thousands of (point, inner choice) pairs, too many to replay each; it ranks them with the
screen (peak reserved from the fragment coefficients, :func:`search.step.assemble.screen_step`). Whether a
plan fits is then decided by the replay of its step (:func:`search.step.finish.finish_step`):

1. The screen's ranking is walked in order. Each point the walk takes is resolved again with the replay
   (:func:`resolve`): its inner choices (micro-batch and accumulation, ``empty_cache`` policy, allocator; RLHF: the
   generation batch and a rollout engine's knobs too) in the screen's order, the first replayed, the later ones only
   where they could beat the best replayed so far: fewer screened seconds than its REPLAYED seconds (the screen's
   seconds of a step without ``empty_cache`` calls are the fewest any variant of it replays at; the replay adds its
   calls' seconds and the cudaMallocs after a rollout engine's turn, which differ from one batch split to another:
   issue 42's grpo-q1.5b-a100x4-orlhf lost ZeRO-2 at mb 8x2, 1.402 s, to its own mb 16x1, screened faster, replayed
   at 1.484 s) and a lower bound of the replay's peak reserved (:func:`replay_floor`) within the budget (the
   screen's fragments may be too many). Once one fits, the faster steps' variants come in :func:`replay_order`.
2. The walk takes every point the screen found fitting until ``wanted`` replayed plans fit and no later
   point has fewer screened seconds than the replayed seconds of the last of them; of the points the
   screen found not fitting it takes those whose floor fits, each resolved against the seconds of the last
   wanted (their screened seconds are their least overflow's, not their fastest variant's), and the first ones
   when nothing fits (the closest plans, by the replay's overflow).

Every prediction in the answer is replayed; the screen only chooses which points are replayed. Before a
variant is replayed, a sound floor of its replay (``floor``: :func:`search.choose.live_floor.strategy_floor`,
the requested bytes alive at once in its measured phases, or under policy ``never`` what the phases leave
cached) is held against the usable memory: a variant whose floor overflows cannot fit and is not
replayed unless the point needs a replayed figure (nothing replayed yet while fewer than ``wanted`` plans fit).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from search.choose.candidates import Candidate, SearchResult
from search.prediction import Prediction
from store.errors import InputError
from store.records import RLHFStrategy, Strategy

SCREEN_MARGIN = 0.10  # kept for callers: the screen's reserved may overstate the replay's by more (FLOOR_SLACK)
MAX_REPLAYS_PER_POINT = 4  # a point whose inner choices need more replays keeps the best replayed so far
# The screen's peak allocated (resident plus the largest moment's live bytes) against the replay's peak reserved:
# the replay reserves at least what it allocates, and its allocations are the same tensors in stream order, so
# the screen's allocated is at most the replay's reserved but for the stream's own rounding and ordering, measured
# at most 0.6% over on catalog jobs (tests/search/test_screen_bound.py holds it under this slack).
FLOOR_SLACK = 0.02

Predict = Callable[[Strategy | RLHFStrategy], Prediction]
Floor = Callable[[Strategy | RLHFStrategy], int]
# a lower bound of a variant's screened seconds without ``empty_cache`` calls, cheaper than its screen
# (:func:`search.choose.engine_inner.fewest_seconds`); it reads neither ``empty_cache`` nor the allocator (asked
# once a step: :func:`_step_key`)
Least = Callable[[Strategy | RLHFStrategy], float]
# a lower bound of the replayed score of every variant of a candidate's outer point (search.choose.optimize)
PointLeast = Callable[[Candidate], float]
# the usable GPU bytes the replay of any variant of a candidate's outer point holds its peak reserved against
# (search.choose.optimize.replay_budget: the measured spread of the point's layout)
PointBudget = Callable[[Candidate], int]


def replay_floor(prediction: Prediction) -> int:
    """A lower bound of the replay's peak reserved from a screened prediction: its peak allocated less
    :data:`FLOOR_SLACK` (no fragment coefficient in it: the screen's fragments may overstate the replay's)."""
    return int(prediction.peak_allocated_bytes * (1 - FLOOR_SLACK))


def near_fit(prediction: Prediction) -> bool:
    """Could the replay find it fitting? Host memory is the same in both; on the GPU only a point whose
    :func:`replay_floor` exceeds the budget is certain not to fit. The screen's reserved bytes (with its
    fragment coefficients) order the replays; they never rule a point out (issue 42: a ZeRO-3 plan the screen
    put at 125 GiB replayed at 69 GiB). The budget compared is the GPU's usable bytes beside the CUDA context,
    before the plan's spread is kept free: a replayed plan's spread may be smaller than its screen's."""
    return prediction.fits_host and replay_floor(prediction) <= usable_bound(prediction)


def usable_bound(prediction: Prediction) -> float:
    """At least the usable GPU bytes of every strategy on the same GPU: a budget is the least of the GPU's
    memory less its safety margin and the context, and of the memory beside the context over (1 + spread)
    (:func:`search.step.assemble.gpu_budget_bytes`), so budget x (1 + spread) is at least the least of those
    two without a spread, which bounds every other strategy's budget."""
    return prediction.gpu_budget_bytes * (1 + max(0.0, prediction.reserved_uncertainty))


def cannot_fit(
    variant: Strategy | RLHFStrategy, screened: Prediction, floor: Floor | None, budget: int | None = None
) -> bool:
    """Is ``variant`` certain not to fit by the replay: its screened host bytes overflow, its screen's floor
    (:func:`near_fit`) or its stream's live floor (``floor``) exceeds the usable bytes of any strategy, or
    ``budget``, the usable bytes a replay of a variant of the same outer point found (a point's variants
    differ in batch split, ``empty_cache`` and allocator only, and the measured spread that sets the budget
    reads the layout: :func:`search.spread.kinds.kind_of`)? The screen's floor is held against ``budget`` too
    before the stream's is built (a step's stream build costs about what its replay does)."""
    if not near_fit(screened):
        return True
    if budget is not None and replay_floor(screened) > budget:
        return True
    if floor is None:
        return False
    return floor(variant) > (usable_bound(screened) if budget is None else budget)


def resolve(
    variants: Sequence[Strategy | RLHFStrategy],
    screen: Predict,
    predict: Predict,
    first: Candidate | None = None,
    *,
    floor: Floor | None = None,
    needed: bool = True,
    limit: float = math.inf,
    least_seconds: Least | None = None,
    budget: int | None = None,
) -> tuple[Candidate | None, float, int]:
    """(the best of ``variants`` by the replay, its screened seconds, replays made); None when none is valid.

    The variants are replayed in the screen's order (best screened score first; ``variants`` come simplest
    first, and the earlier wins among equals), those whose replay floor overflows the budget (:func:`near_fit`)
    only when nothing before them was replayed, until one fits; after it, the variants of the steps that could
    still beat it, in :func:`replay_order`. At most :data:`MAX_REPLAYS_PER_POINT` replays, ``first``'s among them
    when it fits (:func:`_beaten` then goes on from it); a ``first`` that does not fit is not charged to the cap.
    The count returned is every replay made, ``first``'s included on both paths (it left out a ``first`` that did
    not fit, where it counted one that fits).

    ``first``: the screen's best of them (the search's own choice), replayed first; when it fits, only the
    variants of steps that could be faster are screened (a step's fewest seconds are those of its variant
    without ``empty_cache`` calls).

    ``floor``: a sound lower bound of a variant's replayed peak reserved; a variant it proves cannot fit is
    not replayed once another was, nor at all when ``needed`` is False (the caller has enough fitting plans:
    a point that does not fit adds nothing to its answer). ``limit``: the replayed seconds the caller's answer
    already holds enough fitting plans below; a variant whose screened seconds reach it is not replayed unless
    ``needed`` (it could not enter the answer). ``least_seconds``: see :func:`_beaten`; with a ``limit``, a variant
    it puts at or above the limit is not screened either (its screened seconds, those of its step without
    ``empty_cache`` calls and the calls' own, would reach the limit too). ``budget``: the usable bytes every
    variant's replay holds its peak reserved against, where the caller knows them before a replay says them
    (:func:`cannot_fit`'s ``budget``; without it, the bound of every strategy's until a replay)."""
    if needed:
        limit = math.inf
    tried: set[int] = set()  # replayed already
    replays = 0  # every replay of the point, first's among them: what the caller counts
    cap = MAX_REPLAYS_PER_POINT  # of ``replays``
    # once a variant fits, the variants of the steps that could beat it (replay_order)
    go_on = partial(_beaten, variants, screen, predict, floor=floor, limit=limit, least_seconds=least_seconds)
    if first is not None and (
        needed
        or (first.prediction.step_time_s < limit and not cannot_fit(first.strategy, first.prediction, floor, budget))
    ):
        replayed = _replayed(first.strategy, predict)
        replays += 1
        # by the variant replayed, not the candidate: _replayed may fill in the engine's solved utilization
        tried.update(i for i, v in enumerate(variants) if v == first.strategy)
        if replayed.prediction.fits:
            index = min(tried, default=len(variants))
            return go_on(replayed, first.prediction.step_time_s, replays=replays, tried=tried, index=index)
        budget = replayed.prediction.gpu_budget_bytes
        cap += 1  # the search's choice did not fit: its replay is not charged to the cap
    best: tuple[float, int, Candidate, float] | None = None
    for _, i, prediction in _screened_below(variants, screen, limit, least_seconds):
        if replays >= cap:
            break
        if i in tried or prediction.step_time_s >= limit:
            continue  # replayed first, or it could not enter the caller's answer
        if (best is not None or not needed) and cannot_fit(variants[i], prediction, floor, budget):
            continue  # even its floor overflows: the replay cannot find it fitting
        candidate = _replayed(variants[i], predict)
        budget = candidate.prediction.gpu_budget_bytes
        replays += 1
        tried.add(i)
        if candidate.prediction.fits:
            return go_on(candidate, prediction.step_time_s, replays=replays, cap=cap, tried=tried, index=i)
        if best is None or (candidate.score, i) < best[:2]:
            best = (candidate.score, i, candidate, prediction.step_time_s)
    if best is None:
        return None, 0.0, replays
    return best[2], best[3], replays


def _screened_below(
    variants: Sequence[Strategy | RLHFStrategy], screen: Predict, limit: float, least_seconds: Least | None
) -> list[tuple[float, int, Prediction]]:
    """:func:`_screened` of ``variants``, best score first; with a finite ``limit`` (the point is not needed), only
    those ``least_seconds`` puts below it (the rest would be screened for naught)."""
    indices: Iterable[int] = range(len(variants))
    if limit < math.inf and least_seconds is not None:
        least: dict[Strategy | RLHFStrategy | tuple[Any, ...], float] = {}  # by step (:func:`_step_key`)
        below = []
        for i in indices:
            step = _step_key(variants[i])
            if step not in least:
                least[step] = least_seconds(variants[i])
            if least[step] < limit:
                below.append(i)
        indices = below
    return sorted(_screened(indices, variants, screen), key=lambda entry: entry[:2])


def _step_key(variant: Strategy | RLHFStrategy) -> Strategy | RLHFStrategy | tuple[Any, ...]:
    """``variant`` but for its ``empty_cache`` policy and allocator, which :data:`Least` does not read: one key for
    the variants of a step (an RLHF variant's fields as a tuple, cheaper than the strategy rebuilt)."""
    if isinstance(variant, RLHFStrategy):
        v = variant
        return (
            v.actor,
            v.critic,
            v.reference,
            v.reward,
            v.hybrid_engine,
            v.ema,
            v.rollout,
            v.generation_batch,
            v.micro_batch,
            v.grad_accum,
        )
    return replace(variant, empty_cache="never", allocator="default")


def _replayed(variant: Strategy | RLHFStrategy, predict: Predict) -> Candidate:
    """``variant`` replayed, with the ``gpu_memory_utilization`` the replay solved where the variant left it open
    (a rollout engine's knob variants: :func:`search.choose.optimize.rlhf_variants`): a plan names the value its
    prediction holds, not an open one an export would leave to the framework's default."""
    prediction = predict(variant)
    solved = prediction.rollout.get("gpu_memory_utilization")
    rollout = variant.rollout if isinstance(variant, RLHFStrategy) else None
    if isinstance(variant, RLHFStrategy) and rollout is not None and rollout.gpu_memory_utilization is None:
        variant = variant.with_(rollout=rollout.with_(gpu_memory_utilization=solved))
    return Candidate(variant, prediction)


def _screened(
    indices: Iterable[int], variants: Sequence[Strategy | RLHFStrategy], screen: Predict
) -> list[tuple[float, int, Prediction]]:
    """(screened score, index, screened prediction) of the valid ones among ``variants[indices]``."""
    out = []
    for i in indices:
        try:
            prediction = screen(variants[i])
        except InputError:  # a batch split this workload cannot run
            continue
        out.append((Candidate(variants[i], prediction).score, i, prediction))
    return out


def _beaten(
    variants: Sequence[Strategy | RLHFStrategy],
    screen: Predict,
    predict: Predict,
    best: Candidate,
    seconds: float,
    floor: Floor | None = None,
    limit: float = math.inf,
    *,
    replays: int,
    cap: int = MAX_REPLAYS_PER_POINT,
    tried: frozenset[int] | set[int] = frozenset(),
    index: int,
    least_seconds: Least | None = None,
) -> tuple[Candidate, float, int]:
    """``best`` (replayed, it fits) against the variants that could be faster: those of the steps whose variant
    without ``empty_cache`` calls has fewer screened seconds than ``best``'s replayed seconds. A step's screened
    seconds without ``empty_cache`` calls are the fewest any of its variants can replay at (the replay adds the
    seconds of its calls and of the cudaMallocs after a rollout engine's turn, which differ from split to split:
    the bound is held against the replayed seconds, never the screened ones). ``seconds``: ``best``'s screened
    seconds, returned with it when no variant beats it. ``limit``: see :func:`resolve`. The faster steps' variants
    are replayed in :func:`replay_order`. ``replays``: every replay of the point so far (``first``'s and ``best``'s
    among them), at most ``cap`` (see :func:`resolve`); ``tried``: the indices of the variants replayed, ``best``'s
    variant among them; ``index``: ``best``'s variant's (the number of variants when it is none of them), for ties
    (a candidate's strategy may carry the engine utilization its replay solved, so it is found by index, not by
    equality). ``least_seconds``: a lower bound of a step's screened seconds without ``empty_cache`` calls; a step
    it puts at or above the best replayed seconds is passed over unscreened (its screen would put it there too:
    most of a point's steps, each a step to build, issue 42's recommend latency)."""
    steps: dict[Strategy | RLHFStrategy | tuple[Any, ...], list[int]] = {}  # by step (:func:`_step_key`)
    for i, strategy in enumerate(variants):
        steps.setdefault(_step_key(strategy), []).append(i)
    limit = min(limit, best.prediction.step_time_s)  # the best replayed seconds so far
    faster: list[tuple[float, list[tuple[float, int, Prediction]]]] = []  # (least seconds, screened variants)
    for members in steps.values():
        # the step's variant without empty_cache calls (the step's key names every other field)
        own = [i for i in members if variants[i].empty_cache == "never" and variants[i].allocator == "default"]
        if own and least_seconds is not None and least_seconds(variants[own[0]]) >= limit:
            continue  # no variant of this step can replay faster, by a bound cheaper than its screen
        fewest_own = _screened(own, variants, screen)
        if own and not fewest_own:
            continue  # a batch split this workload cannot run
        least = fewest_own[0][2].step_time_s if fewest_own else 0.0
        if least >= limit:
            continue  # no variant of this step can replay faster
        rest = _screened([i for i in members if i not in own], variants, screen)
        others = (e for e in fewest_own + rest if e[1] not in tried)
        faster.append((least, [e for e in others if near_fit(e[2])]))
    score = best.score
    for least, (_, i, prediction) in replay_order(faster):
        if replays >= cap:
            break
        if least >= min(limit, best.prediction.step_time_s):
            continue  # no faster than the best replayed since (or than the caller's answer holds enough below)
        if floor is not None and cannot_fit(variants[i], prediction, floor, best.prediction.gpu_budget_bytes):
            continue  # its stream's floor overflows the point's budget: it cannot fit
        candidate = _replayed(variants[i], predict)
        replays += 1
        if (candidate.score, i) < (score, index):
            best, seconds, score, index = candidate, prediction.step_time_s, candidate.score, i
    return best, seconds, replays


def replay_order(
    steps: Sequence[tuple[float, Sequence[tuple[float, int, Prediction]]]],
) -> list[tuple[float, tuple[float, int, Prediction]]]:
    """The order the variants of the steps that could beat a point's best replayed plan are replayed in, from
    each step's least seconds (its screened seconds without ``empty_cache`` calls) and its variants'
    ``(screened score, index, screened prediction)``; each entry comes back with its step's least seconds.

    Turn by turn: every step's first variant before any step's second (so that a step that could win is not
    left out by :data:`MAX_REPLAYS_PER_POINT`); within a turn, the steps by their least seconds, fastest
    first (the most a replay of them could gain). Within a step, the screen's best first (its score: one its
    fragments let fit, else the least overflow; the earlier among equals), the most likely to fit; then the
    others fastest by the screen first (a step whose best fits may fit with fewer ``empty_cache`` calls too:
    ``ppo-q7b-h100x8-orlhf``'s sleep level 0 with expandable segments fits at 1.497 s after inference, 1.455 s
    without calls, where ``after-phase``, its second by the screen's score, is 1.606 s). Ordering a turn
    by the variants' scores instead put every step whose variants the screen's fragments reject after every
    step they accept, however slow: issue 42's qwen2.5-7b GRPO under --framework trl spent its point's replays
    on sleep level 2's generation batches (3.76 s) and never replayed sleep level 0 (3.46 s, fits)."""
    turns: list[tuple[int, float, float, int, float, tuple[float, int, Prediction]]] = []
    for least, members in steps:
        ranked = sorted(members, key=lambda e: e[:2])
        ranked[1:] = sorted(ranked[1:], key=lambda e: (e[2].step_time_s, *e[:2]))
        for turn, entry in enumerate(ranked):
            turns.append((turn, least, entry[0], entry[1], least, entry))
    turns.sort(key=lambda t: t[:4])
    return [(t[4], t[5]) for t in turns]


def confirm(
    result: SearchResult,
    wanted: int,
    variants: Callable[[Any], Sequence[Strategy | RLHFStrategy]],
    screen: Predict,
    predict: Predict,
    floor: Floor | None = None,
    *,
    quick: bool = False,
    least_seconds: Least | None = None,
    point_least: PointLeast | None = None,
    point_budget: PointBudget | None = None,
) -> SearchResult:
    """``result`` (ranked by the screen) with its points resolved by the replay (see the module docstring):
    ranked by the replayed scores, ``replays`` counted. ``fastest_ignoring_memory`` stays the screen's: a
    yardstick of time, whose memory the search does not decide with. ``floor``: see :func:`resolve`.
    ``quick``: once ``wanted`` plans fit, the points the screen rejects are passed over (for a caller that asks
    whether a change of the job fits at all: their faster variants seldom fit, and each costs replays).
    ``least_seconds``: a lower bound of a variant's screened seconds without ``empty_cache`` calls (see
    :func:`_beaten`); it changes no answer, only how many steps are built. ``point_least``: a lower bound of the
    replayed score of every variant of a candidate's outer point; a point the screen found fitting is passed over
    only when that bound cannot beat the answer, not on its own screened seconds, which are those of its fastest
    variant the screen's fragments let fit (issue 42's GRPO of qwen3-1.7b on two L40S: the screen fit ZeRO-2 with
    the reference at ZeRO-3 at mb 4x4, 2.93 s, and rejected its mb 8x2, which the replay fits at 2.65 s). Without
    it, a candidate's screened seconds stand for its point's. ``point_budget``: the usable bytes of a candidate's
    point (:data:`PointBudget`), against which a variant's floor is held before any of its replays: a point the
    caller does not need replays no variant whose floor overflows them (issue 42's demo: 36 of its points each
    replayed one such variant, none fitting)."""
    confirmed: list[tuple[Candidate, float]] = []  # with its screened seconds
    replays = 0
    seen: set[Strategy | RLHFStrategy] = set()
    for candidate in result.ranked:
        # the replayed seconds of those that fit: a point's screened seconds are at most its replay's
        fitting = sorted(c.prediction.step_time_s for c, _ in confirmed if c.prediction.fits)
        limit = fitting[wanted - 1] if len(fitting) >= wanted else math.inf
        fastest = candidate.prediction.step_time_s if point_least is None else point_least(candidate)
        if candidate.prediction.fits and fastest >= limit:
            continue  # no variant of its point can beat the last of those wanted (equals keep the screen's order)
        if not candidate.prediction.fits and len(confirmed) >= wanted and not near_fit(candidate.prediction):
            continue
        if not candidate.prediction.fits and quick and limit < math.inf:
            continue
        # a point the screen rejects is not passed over on its seconds: they are those of its least overflow,
        # not its fastest variant's (issue 42's GRPO of qwen2.5-7b under --framework openrlhf: its ZeRO-2 point
        # with checkpointing fits at 3.95 s by the replay, where the screen's closest variant takes 4.74 s)
        exact, seconds, made = resolve(
            variants(candidate.strategy),
            screen,
            predict,
            candidate,
            floor=floor,
            needed=limit == math.inf,
            limit=limit,
            least_seconds=least_seconds,
            budget=None if point_budget is None else point_budget(candidate),
        )
        replays += made
        if exact is not None and exact.strategy not in seen:
            seen.add(exact.strategy)
            confirmed.append((exact, seconds))
    ranked = sorted((c for c, _ in confirmed), key=lambda c: c.rank_key)  # stable: equals keep the screen's order
    return replace(result, ranked=tuple(ranked), replays=replays)
