"""The confirmation passes over a point's steps that a cheap bound puts at or above its best replayed seconds.

Once a variant of a point fits, ``search.choose.confirm._beaten`` screens each step's variant without
``empty_cache`` calls to learn whether the step could be faster: most of them cannot (issue 42: 1,717 of the
1,753 steps of the demo's searches), and each screen builds a step. ``least_seconds`` (for a rollout engine's
steps :func:`search.choose.engine_inner.fewest_seconds`, its trainer's share cached per point and batch split)
is a lower bound of that screen's seconds: a step it puts at or above the limit is passed over unscreened, and
the answer is the same.
"""

from __future__ import annotations

from fake_predictions import prediction as fake_prediction
from small_jobs import grpo_opt125m

from search import DEFAULT_COEFFICIENTS as C
from search import screen_rlhf
from search.choose.candidates import Candidate
from search.choose.confirm import resolve
from search.choose.engine_inner import best_inner_engine, fewest_seconds
from search.choose.optimize import rlhf_variants
from search.choose.rlhf_space import rlhf_outer_points
from search.choose.rollout_space import searched_generations
from search.prediction import Prediction
from store.records import RLHFStrategy, Strategy


def test_a_step_the_bound_puts_above_the_best_replayed_is_never_screened_and_the_answer_is_the_same() -> None:
    """mb 1 (the search's choice) replays fitting at 2.0 s. mb 2 is faster (1.5 s) and fits; mb 4 and mb 8
    screen at 2.5 s and 3.0 s, which their bounds (2.4 s, 2.0 s) already put at or above 2.0 s."""
    variants = [Strategy(micro_batch=m, empty_cache=p) for m in (1, 2, 4, 8) for p in ("never", "every-step")]
    seconds = {1: 2.0, 2: 1.5, 4: 2.5, 8: 3.0}
    bounds = {1: 1.9, 2: 1.4, 4: 2.4, 8: 2.0}  # each below its screen, mb 8's exactly at the best replayed
    screened: list[tuple[int, str]] = []

    def screen(s: Strategy | RLHFStrategy) -> Prediction:
        assert isinstance(s, Strategy)
        screened.append((s.micro_batch, s.empty_cache))
        return fake_prediction(seconds[s.micro_batch] + (0.1 if s.empty_cache != "never" else 0.0), 9.0)

    def replay(s: Strategy | RLHFStrategy) -> Prediction:
        assert isinstance(s, Strategy)
        return fake_prediction(seconds[s.micro_batch] + (0.1 if s.empty_cache != "never" else 0.0), 9.5)

    def least(s: Strategy | RLHFStrategy) -> float:
        assert isinstance(s, Strategy) and s.empty_cache == "never"
        return bounds[s.micro_batch]

    first = Candidate(variants[0], fake_prediction(2.0, 9.0))
    without = resolve(variants, screen, replay, first)
    screened_without, screened[:] = list(screened), []
    found, at, made = resolve(variants, screen, replay, first, least_seconds=least)
    assert found is not None and without[0] is not None
    assert (found.strategy, at, made) == (without[0].strategy, without[1], without[2])
    assert found.strategy.micro_batch == 2
    assert {(4, "never"), (8, "never")} <= set(screened_without)  # the case means something: both were screened
    assert not {m for m, _ in screened} & {4, 8}


def test_a_point_resolved_against_a_limit_screens_no_variant_the_bound_puts_at_or_above_it() -> None:
    """The search's choice (mb 1) is not needed (the answer holds enough plans below 2.0 s) and does not fit when
    replayed; of the others only mb 2 can be faster than 2.0 s by its bound: mb 4's and mb 8's are not screened,
    and the answer is the same."""
    variants = [Strategy(micro_batch=m) for m in (1, 2, 4, 8)]
    seconds = {1: 1.5, 2: 1.8, 4: 2.5, 8: 3.0}
    bounds = {1: 1.4, 2: 1.7, 4: 2.0, 8: 2.9}
    screened: list[int] = []

    def screen(s: Strategy | RLHFStrategy) -> Prediction:
        assert isinstance(s, Strategy)
        screened.append(s.micro_batch)
        return fake_prediction(seconds[s.micro_batch], 9.0)

    def replay(s: Strategy | RLHFStrategy) -> Prediction:
        assert isinstance(s, Strategy)
        return fake_prediction(seconds[s.micro_batch], 10.5 if s.micro_batch == 1 else 9.5)

    def least(s: Strategy | RLHFStrategy) -> float:
        assert isinstance(s, Strategy)
        return bounds[s.micro_batch]

    first = Candidate(variants[0], fake_prediction(1.5, 9.0))
    without = resolve(variants, screen, replay, first, needed=False, limit=2.0)
    screened_without, screened[:] = list(screened), []
    found, at, made = resolve(variants, screen, replay, first, needed=False, limit=2.0, least_seconds=least)
    assert found is not None and without[0] is not None and found.strategy.micro_batch == 2
    assert (found.strategy, at, made) == (without[0].strategy, without[1], without[2])
    assert {4, 8} <= set(screened_without) and not {4, 8} & set(screened)


def test_the_bound_is_below_the_screen_of_every_step_the_confirmation_meets() -> None:
    """For the variants a confirmation meets (each knob variant, its utilization solved or open, at every
    batch split, every ``empty_cache`` policy and allocator): the bound is at most the variant's screened
    seconds (those of its step without calls, and the calls'); 0.0 (no bound) for a single-model strategy."""
    workload, hardware = grpo_opt125m()
    points = list(rlhf_outer_points(workload, hardware, (0,), searched_generations(workload, hardware)))
    engines = [p for p in points if p.rollout is not None]
    assert engines
    checked = 0
    for point in engines[:: max(1, len(engines) // 3)]:
        chosen = best_inner_engine(point, workload, hardware, C).strategy
        for variant in rlhf_variants(workload, hardware, chosen):
            screened = screen_rlhf(workload, variant, hardware, C).step_time_s
            assert 0.0 < fewest_seconds(workload, hardware, C, variant) <= screened, variant.describe()
            checked += 1
    assert checked > 100
    assert fewest_seconds(workload, hardware, C, Strategy()) == 0.0


def test_the_bound_of_deepspeeds_own_generation_is_its_screen_a_hair_below() -> None:
    """For DeepSpeed's own generation (hybrid engine or HF ``generate``, EMA on and off): the bound is at most
    every variant's screened seconds and within a billionth of its step's without ``empty_cache`` calls (the
    models' seconds at the split and the shared ones are the step's, summed in another order)."""
    workload, hardware = grpo_opt125m()
    points = list(rlhf_outer_points(workload, hardware, (0,), searched_generations(workload, hardware)))
    deepspeed = [p for p in points if p.rollout is None]
    assert {p.hybrid_engine for p in deepspeed} == {True, False}
    checked = 0
    for point in deepspeed[:: max(1, len(deepspeed) // 4)]:
        for ema in (False, True):
            strategy = RLHFStrategy(point.actor, point.critic, point.reference, point.reward, point.hybrid_engine)
            for variant in rlhf_variants(workload, hardware, strategy.with_(ema=ema))[::3]:
                screened = screen_rlhf(workload, variant, hardware, C).step_time_s
                bound = fewest_seconds(workload, hardware, C, variant)
                assert 0.0 < bound <= screened, variant.describe()
                if variant.empty_cache == "never":
                    assert bound >= screened * (1 - 1e-8), variant.describe()
                checked += 1
    assert checked > 100
