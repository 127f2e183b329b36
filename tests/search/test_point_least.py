"""A point the screen lets fit only at a slow batch split is still confirmed where a faster split of it could fit
by the replay (issue 42: the regret benchmark's ``grpo-q3-1.7b-l40sx2-ds``, +3.6% against the best the model knows).

qwen3-1.7b GRPO on two L40S: the screen fit ZeRO-2 with the reference at ZeRO-3 at mb 4x4 (2.93 s) and rejected
its mb 8x2, which the replay fits at 2.65 s. Three things passed it over: the confirmation judged the point by the
screened seconds of its fitting split (:func:`search.choose.confirm.confirm` now takes ``point_least``, a lower bound of
every variant's replayed score); the engine's replay bound added the trainer's bytes without the screen's slack
in the sleep-level-0 term (:func:`search.choose.engine_inner.engine_bound` was above the replayed score); and the
point's variants held the engine's knobs only at the utilization the screen solved for mb 4x4, so mb 8x2 was
never replayed with the utilization solved for it (:func:`search.choose.optimize.rlhf_variants`).
"""

from __future__ import annotations

from pathlib import Path

from fake_predictions import prediction as fake_prediction

from benchmarks.regret_jobs import JOBS
from benchmarks.search_regret import resolved
from search import Coefficients, predict
from search.choose.candidates import Candidate, SearchResult
from search.choose.confirm import confirm
from search.choose.engine_inner import engine_bound
from search.choose.optimize import rlhf_point_least, rlhf_variants
from search.choose.rlhf_space import RLHFOuterPoint
from search.prediction import Prediction
from store.records import FrozenModelStrategy, Hardware, RLHFStrategy, Strategy, TrainedModelStrategy, Workload
from store.rollout import RolloutStrategy


def test_a_point_is_confirmed_by_the_least_its_variants_could_replay_at() -> None:
    """Point A (ZeRO-1) fits at 3.0 s. Point B (ZeRO-2) the screen lets fit only at mb 1 (3.5 s); its mb 8 the
    screen rejects, and the replay fits it at 2.7 s. Judged by its screened 3.5 s, B is passed over; judged by a
    lower bound of its variants (2.6 s), it is resolved and its mb 8 wins."""
    a = Strategy(zero_stage=1, micro_batch=1)
    b1, b8 = Strategy(zero_stage=2, micro_batch=1), Strategy(zero_stage=2, micro_batch=8)
    screened = {a: fake_prediction(3.0, 9.0), b1: fake_prediction(3.5, 9.0), b8: fake_prediction(2.6, 10.5)}
    replayed = {a: fake_prediction(3.0, 9.5), b1: fake_prediction(3.5, 9.5), b8: fake_prediction(2.7, 9.8)}
    result = SearchResult(ranked=(Candidate(a, screened[a]), Candidate(b1, screened[b1])), trials=2, sampler="grid")

    def variants(s: Strategy | RLHFStrategy) -> list[Strategy | RLHFStrategy]:
        return [a] if s == a else [b1, b8]

    def least(c: Candidate) -> float:
        return 2.6 if c.strategy in (b1, b8) else 3.0

    def screen(s: Strategy | RLHFStrategy) -> Prediction:
        assert isinstance(s, Strategy)
        return screened[s]

    def replay(s: Strategy | RLHFStrategy) -> Prediction:
        assert isinstance(s, Strategy)
        return replayed[s]

    old = confirm(result, 1, variants, screen, replay)
    assert old.best is not None and old.best.strategy == a  # what the confirmation chose before
    new = confirm(result, 1, variants, screen, replay, point_least=least)
    assert new.best is not None and new.best.strategy == b8 and new.best.prediction.step_time_s == 2.7


def _job(tmp_path: Path) -> tuple[Workload, Hardware, Coefficients]:
    job = next(j for j in JOBS if j.name == "grpo-q3-1.7b-l40sx2-ds")
    return resolved(job, f"sqlite:///{tmp_path / 'plans.db'}")


# the best the model knows for grpo-q3-1.7b-l40sx2-ds (benchmarks/search_regret.py's oracle, 2026-11-29)
ENGINE = RolloutStrategy(
    engine="sglang", placement="colocate", tensor_parallel=2, sleep_level=0, offload_training=False
)
BEST = RLHFStrategy(
    actor=TrainedModelStrategy(zero_stage=2),
    critic=None,
    reference=FrozenModelStrategy(zero_stage=3),
    reward=FrozenModelStrategy(zero_stage=0),
    hybrid_engine=False,
    rollout=ENGINE,
    generation_batch=4,
    micro_batch=8,
    grad_accum=2,
    empty_cache="never",
    allocator="expandable-segments",
)


def test_the_engine_bound_is_below_the_replayed_score_of_a_plan_that_fits_by_a_hair(tmp_path: Path) -> None:
    """mb 8x2 with the engine awake through training (sleep level 0) replays fitting with 20 MiB to spare; the
    point's engine bound (the trainer's resident and live bytes less the screen's slack, plus the engine's least)
    must not exceed its replayed seconds, or the bound walk and the confirmation pass the point over."""
    workload, hardware, coef = _job(tmp_path)
    replayed = predict(workload, BEST, hardware, coef)
    assert replayed.fits
    point = RLHFOuterPoint(BEST.actor, None, BEST.reference, BEST.reward, False, ENGINE)
    assert engine_bound(point, workload, hardware, coef) <= replayed.step_time_s
    assert rlhf_point_least(workload, hardware, coef, Candidate(BEST, replayed)) <= replayed.step_time_s


def test_a_points_variants_hold_its_engine_knobs_unsolved_too(tmp_path: Path) -> None:
    """A candidate's engine carries the utilization the screen solved for its own split; its point's variants
    also hold the same knobs with the utilization open, for the replay to solve at each other split."""
    workload, hardware, _ = _job(tmp_path)
    solved = BEST.with_(rollout=ENGINE.with_(gpu_memory_utilization=0.38), micro_batch=4, grad_accum=4)
    variants = rlhf_variants(workload, hardware, solved)
    engines = {v.rollout for v in variants}
    assert ENGINE.with_(gpu_memory_utilization=0.38) in engines and ENGINE in engines
    assert any(v.rollout == ENGINE and (v.micro_batch, v.grad_accum) == (8, 2) for v in variants)
