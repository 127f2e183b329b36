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
   screen's fragments may be too many).
2. The walk takes every point the screen found fitting until ``wanted`` replayed plans fit and no later
   point has fewer screened seconds than the replayed seconds of the last of them; of the points the
   screen found not fitting it takes those whose floor fits that could beat them, and the first ones when
   nothing fits (the closest plans, by the replay's overflow).

Every prediction in the answer is replayed; the screen only chooses which points are replayed. Before a
variant is replayed, a sound floor of its replay (``floor``: :func:`search.choose.live_floor.measured_live_floor`,
the requested bytes alive at once in its measured phases, the same for every ``empty_cache`` and allocator
variant of a step) is held against the usable memory: a variant whose floor overflows cannot fit and is not
replayed unless the point needs a replayed figure (nothing replayed yet while fewer than ``wanted`` plans fit).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
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
    reads the layout: :func:`search.spread.kinds.kind_of`)?"""
    if not near_fit(screened):
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
) -> tuple[Candidate | None, float, int]:
    """(the best of ``variants`` by the replay, its screened seconds, replays made); None when none is valid.

    The variants are replayed in the screen's order (best screened score first; ``variants`` come simplest
    first, and the earlier wins among equals), those whose replay floor overflows the budget
    (:func:`near_fit`) only when nothing before them was replayed, until one fits; after it, only those that
    could still beat it: fewer screened seconds than its replayed seconds. At most
    :data:`MAX_REPLAYS_PER_POINT` replays.

    ``first``: the screen's best of them (the search's own choice), replayed first; when it fits, only the
    variants of steps that could be faster are screened (a step's fewest seconds are those of its variant
    without ``empty_cache`` calls).

    ``floor``: a sound lower bound of a variant's replayed peak reserved; a variant it proves cannot fit is
    not replayed once another was, nor at all when ``needed`` is False (the caller has enough fitting plans:
    a point that does not fit adds nothing to its answer)."""
    budget: int | None = None  # the point's usable bytes, once a replay has said them
    if first is not None and (needed or not cannot_fit(first.strategy, first.prediction, floor)):
        replayed = Candidate(first.strategy, predict(first.strategy))
        if replayed.prediction.fits:
            return _beaten(variants, screen, predict, replayed, first.prediction.step_time_s, floor)
        budget = replayed.prediction.gpu_budget_bytes
    screened = _screened(range(len(variants)), variants, screen)
    screened.sort(key=lambda entry: entry[:2])
    best: tuple[float, int, Candidate, float] | None = None
    replays = 0
    for _, i, prediction in screened:
        if replays >= MAX_REPLAYS_PER_POINT:
            break
        if best is not None and best[2].prediction.fits and prediction.step_time_s >= best[2].prediction.step_time_s:
            continue  # it cannot beat the best replayed (equals keep the screen's preference)
        if (best is not None or not needed) and cannot_fit(variants[i], prediction, floor, budget):
            continue  # even its floor overflows: the replay cannot find it fitting
        candidate = Candidate(variants[i], predict(variants[i]))
        budget = candidate.prediction.gpu_budget_bytes
        replays += 1
        if best is None or (candidate.score, i) < best[:2]:
            best = (candidate.score, i, candidate, prediction.step_time_s)
    if best is None:
        return None, 0.0, replays
    return best[2], best[3], replays


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
) -> tuple[Candidate, float, int]:
    """``best`` (replayed, it fits) against the variants that could be faster: those of the steps whose variant
    without ``empty_cache`` calls has fewer screened seconds than ``best``'s replayed seconds. A step's screened
    seconds without ``empty_cache`` calls are the fewest any of its variants can replay at (the replay adds the
    seconds of its calls and of the cudaMallocs after a rollout engine's turn, which differ from split to split:
    the bound is held against the replayed seconds, never the screened ones). ``seconds``: ``best``'s screened
    seconds, returned with it when no variant beats it."""
    steps: dict[Strategy | RLHFStrategy, list[int]] = {}  # by the variant without empty_cache calls
    for i, strategy in enumerate(variants):
        steps.setdefault(replace(strategy, empty_cache="never", allocator="default"), []).append(i)
    limit = best.prediction.step_time_s  # the best replayed seconds so far
    # (turn within its step, screened score, index, screened, least seconds): each faster step's best screened
    # variant is replayed before any step's second, so a step that could win is not left out by the cap
    faster: list[tuple[int, float, int, Prediction, float]] = []
    for fewest, members in steps.items():
        own = [i for i in members if variants[i] == fewest]
        fewest_own = _screened(own, variants, screen)
        if own and not fewest_own:
            continue  # a batch split this workload cannot run
        least = fewest_own[0][2].step_time_s if fewest_own else 0.0
        if least >= limit:
            continue  # no variant of this step can replay faster
        rest = _screened([i for i in members if i not in own], variants, screen)
        kept = sorted(e for e in fewest_own + rest if near_fit(e[2]) and variants[e[1]] != best.strategy)
        faster += [(turn, *e, least) for turn, e in enumerate(kept)]
    faster.sort(key=lambda entry: entry[:3])
    replays, score = 1, best.score
    index = variants.index(best.strategy) if best.strategy in variants else len(variants)
    for _, _, i, prediction, least in faster:
        if replays >= MAX_REPLAYS_PER_POINT:
            break
        if least >= best.prediction.step_time_s:
            continue  # no faster than the best replayed since
        if floor is not None and cannot_fit(variants[i], prediction, floor, best.prediction.gpu_budget_bytes):
            continue  # its stream's floor overflows the point's budget: it cannot fit
        candidate = Candidate(variants[i], predict(variants[i]))
        replays += 1
        if (candidate.score, i) < (score, index):
            best, seconds, score, index = candidate, prediction.step_time_s, candidate.score, i
    return best, seconds, replays


def confirm(
    result: SearchResult,
    wanted: int,
    variants: Callable[[Any], Sequence[Strategy | RLHFStrategy]],
    screen: Predict,
    predict: Predict,
    floor: Floor | None = None,
) -> SearchResult:
    """``result`` (ranked by the screen) with its points resolved by the replay (see the module docstring):
    ranked by the replayed scores, ``replays`` counted. ``fastest_ignoring_memory`` stays the screen's: a
    yardstick of time, whose memory the search does not decide with. ``floor``: see :func:`resolve`."""
    confirmed: list[tuple[Candidate, float]] = []  # with its screened seconds
    replays = 0
    seen: set[Strategy | RLHFStrategy] = set()
    for candidate in result.ranked:
        # the replayed seconds of those that fit: a point's screened seconds are at most its replay's
        fitting = sorted(c.prediction.step_time_s for c, _ in confirmed if c.prediction.fits)
        if len(fitting) >= wanted and candidate.prediction.step_time_s >= fitting[wanted - 1]:
            continue  # it cannot beat the last of those wanted (equals keep the screen's order)
        if not candidate.prediction.fits and len(confirmed) >= wanted and not near_fit(candidate.prediction):
            continue
        needed = len(fitting) < wanted
        exact, seconds, made = resolve(
            variants(candidate.strategy), screen, predict, candidate, floor=floor, needed=needed
        )
        replays += made
        if exact is not None and exact.strategy not in seen:
            seen.add(exact.strategy)
            confirmed.append((exact, seconds))
    ranked = sorted((c for c, _ in confirmed), key=lambda c: c.rank_key)  # stable: equals keep the screen's order
    return replace(result, ranked=tuple(ranked), replays=replays)
