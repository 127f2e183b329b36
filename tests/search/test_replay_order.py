"""The order a point's faster steps are replayed in (search.choose.confirm.replay_order): the fastest step first
in each turn, whatever the screen's fragments say of it (issue 42: qwen2.5-7b GRPO under --framework trl).

A point's replays are capped (``MAX_REPLAYS_PER_POINT``); once one of its variants fits, the variants of the
steps that could be faster are replayed turn by turn. Ordering a turn by the screen's score put every step the
screen's fragments reject (they may be too many) after every step they accept, however little faster: the cap
was spent on those, and the much faster step that the replay fits was never replayed.
"""

from __future__ import annotations

from dataclasses import replace

from fake_predictions import prediction as fake_prediction

from search.choose.candidates import INFEASIBLE_PENALTY_S, Candidate, SearchResult
from search.choose.confirm import MAX_REPLAYS_PER_POINT, confirm, replay_order, resolve
from search.prediction import Prediction
from store.records import RLHFStrategy, Strategy
from store.rollout import RolloutStrategy


def _entry(index: int, seconds: float, reserved_gib: float) -> tuple[float, int, Prediction]:
    prediction = fake_prediction(seconds, reserved_gib)
    return Candidate(Strategy(micro_batch=index), prediction).score, index, prediction


def test_each_turn_takes_the_fastest_step_first_and_each_step_its_screened_best() -> None:
    """Step 0 (least 3.74 s) the screen lets fit; step 1 (least 3.43 s) it rejects by its fragments. Turn 0:
    step 1's least overflow (index 11) before step 0's best (index 1); turn 1: step 1's second, then step 0's
    faster other (index 4, 3.745 s, which the screen rejects) before its slower one the screen lets fit."""
    slow = (3.74, [_entry(2, 3.75, 9.0), _entry(1, 3.74, 9.0), _entry(4, 3.745, 10.4)])
    fast = (3.43, [_entry(10, 3.43, 12.0), _entry(11, 3.44, 10.5)])
    order = replay_order([slow, fast])
    assert [entry[1] for _, entry in order] == [11, 1, 10, 4, 2]
    assert [least for least, _ in order] == [3.43, 3.74, 3.43, 3.74, 3.74]
    assert order[0][1][0] > INFEASIBLE_PENALTY_S  # the first replayed is one the screen says does not fit


def test_a_much_faster_step_the_screen_rejects_is_replayed_within_the_cap() -> None:
    """The search's choice (mb 1) fits at 4.0 s. Three steps a hair faster (mb 2, 3, 4) the screen lets fit;
    one much faster (mb 8) it rejects, which the replay fits at 3.45 s: replayed right after the choice, and
    then nothing slower than it. Ordered by the screen's score, the three took the cap and mb 8 was lost."""
    assert MAX_REPLAYS_PER_POINT <= 4  # the case needs the cap to bind
    variants = [Strategy(micro_batch=m) for m in (1, 2, 3, 4, 8)]
    screened = {1: fake_prediction(4.0, 9.0), 2: fake_prediction(3.90, 9.0), 3: fake_prediction(3.91, 9.0)}
    screened |= {4: fake_prediction(3.92, 9.0), 8: fake_prediction(3.40, 10.5)}
    replayed = {1: fake_prediction(4.0, 9.5), 2: fake_prediction(3.95, 9.5), 3: fake_prediction(3.96, 9.5)}
    replayed |= {4: fake_prediction(3.97, 9.5), 8: fake_prediction(3.45, 9.8)}
    asked: list[int] = []

    def replay(s: Strategy) -> Prediction:
        asked.append(s.micro_batch)
        return replayed[s.micro_batch]

    first = Candidate(variants[0], screened[1])
    best, seconds, made = resolve(variants, lambda s: screened[s.micro_batch], replay, first)
    assert best is not None and best.strategy.micro_batch == 8 and best.prediction.fits
    assert seconds == 3.40 and asked == [1, 8] and made == 2


def test_a_quick_confirmation_passes_over_the_points_the_screen_rejects_once_a_plan_fits() -> None:
    """Point A (mb 1) the screen lets fit, replayed fitting at 4.0 s; point B (mb 2), rejected by the screen,
    replays fitting at 3.0 s. The full confirmation resolves B (the screen's rejection rules nothing out); a
    quick one (planner's what_would_fit: does a change fit at all?) keeps A and replays B never."""
    a, b = Strategy(micro_batch=1), Strategy(micro_batch=2)
    screened = {1: fake_prediction(4.0, 9.0), 2: fake_prediction(3.0, 10.5)}
    replayed = {1: fake_prediction(4.0, 9.5), 2: fake_prediction(3.0, 9.8)}
    result = SearchResult(ranked=(Candidate(a, screened[1]), Candidate(b, screened[2])), trials=2, sampler="grid")
    for quick, expected in ((False, 2), (True, 1)):
        asked: list[int] = []

        def replay(s: Strategy, asked: list[int] = asked) -> Prediction:
            asked.append(s.micro_batch)
            return replayed[s.micro_batch]

        found = confirm(result, 1, lambda s: [s], lambda s: screened[s.micro_batch], replay, quick=quick)
        assert found.best is not None and found.best.strategy.micro_batch == expected
        assert asked == ([1] if quick else [1, 2])


def test_the_search_choice_is_not_replayed_again_when_its_replay_solved_the_engine_utilization() -> None:
    """A rollout engine's knob variant leaves ``gpu_memory_utilization`` open and its replay solves it, so the
    replayed candidate no longer equals its variant. The choice (mb 4) fits; the variants that could be faster
    are its own step's (screened 3.0 s against 3.2 replayed: itself, and mb 4 with empty_cache) and mb 8's. The
    choice is replayed once, and the cap is spent on the others, not on it again."""
    engine = RolloutStrategy(engine="vllm", sleep_level=0, offload_training=False)
    base = RLHFStrategy(hybrid_engine=False, critic=None, generation_batch=8, empty_cache="never", rollout=engine)
    variants = [
        replace(base, micro_batch=4),
        replace(base, micro_batch=4, empty_cache="after-inference"),
        replace(base, micro_batch=8),
    ]

    def prediction(seconds: float, utilization: float | None = None) -> Prediction:
        found = fake_prediction(seconds, 9.0)
        return replace(found, rollout={"gpu_memory_utilization": utilization}) if utilization else found

    screened = {0: prediction(3.0), 1: prediction(3.05), 2: prediction(3.1)}
    replayed = {0: prediction(3.2, 0.3), 1: prediction(3.25, 0.3), 2: prediction(3.3, 0.3)}
    asked: list[int] = []

    def replay(s: RLHFStrategy) -> Prediction:
        index = variants.index(replace(s, rollout=engine))
        asked.append(index)
        return replayed[index]

    first = Candidate(variants[0], screened[0])
    best, _, made = resolve(variants, lambda s: screened[variants.index(s)], replay, first)
    assert best is not None and best.strategy.rollout is not None
    assert best.strategy.rollout.gpu_memory_utilization == 0.3  # the value its replay solved, kept in the plan
    assert asked.count(0) == 1 and sorted(asked) == [0, 1, 2] and made == 3
