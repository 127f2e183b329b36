"""The confirmation's work per point, cut without changing what it finds (issue 42: recommend's latency).

``resolve`` asks the cheap bound of a variant's seconds (``least_seconds``, :func:`search.choose.engine_inner.
fewest_seconds`) once a step, not once a variant: a step's variants differ in ``empty_cache`` and allocator only,
which the bound does not read (the demo's searches asked it 47,727 times for about 8,000 steps). The bound walk's
per-model bound of a candidate's point (:func:`search.choose.optimize.rlhf_point_least`) reuses the pieces of the
blocks it met before. :func:`search.choose.optimize.rlhf_variants` builds each variant with the constructor and
keeps every field of the strategy but the inner ones.
"""

from __future__ import annotations

from dataclasses import fields, replace

from fake_predictions import prediction as fake_prediction
from small_jobs import grpo_opt125m

from search import DEFAULT_COEFFICIENTS as C
from search import predict_rlhf, screen_rlhf
from search.choose.candidates import Candidate, SearchResult
from search.choose.confirm import _step_key, cannot_fit, confirm, resolve
from search.choose.optimize import replay_budget, rlhf_point_least, rlhf_variants
from search.choose.rlhf_space import rlhf_outer_points
from search.choose.rlhf_walk import point_bounds
from search.choose.rollout_space import searched_generations
from search.prediction import Prediction
from store.records import RLHFStrategy, Strategy, TrainedModelStrategy

GiB = 2**30
INNER = {"generation_batch", "micro_batch", "grad_accum", "empty_cache", "allocator", "rollout"}


def test_the_bound_is_asked_once_a_step_and_the_same_variants_are_screened() -> None:
    """Three steps (mb 1, 2, 4) of two ``empty_cache`` policies each, resolved against a limit of 2.0 s, none
    fitting by the replay: the bound is asked three times (six before), exactly the variants of the steps it puts
    below the limit are screened (mb 1 and mb 2), and the answer is the one found without the bound."""
    variants = [Strategy(micro_batch=m, empty_cache=p) for m in (1, 2, 4) for p in ("never", "every-step")]
    bounds = {1: 1.4, 2: 1.7, 4: 2.0}
    asked: list[Strategy] = []
    screened: list[Strategy] = []

    def screen(s: Strategy | RLHFStrategy) -> Prediction:
        assert isinstance(s, Strategy)
        screened.append(s)
        return fake_prediction(bounds[s.micro_batch] + 0.1, 9.0)

    def replay(s: Strategy | RLHFStrategy) -> Prediction:
        assert isinstance(s, Strategy)
        return fake_prediction(bounds[s.micro_batch] + 0.2, 10.5)

    def least(s: Strategy | RLHFStrategy) -> float:
        assert isinstance(s, Strategy)
        asked.append(s)
        return bounds[s.micro_batch]

    without = resolve(variants, screen, replay, None, needed=False, limit=2.0)
    screened.clear()
    found, at, made = resolve(variants, screen, replay, None, needed=False, limit=2.0, least_seconds=least)
    assert len(asked) == 3 and {s.micro_batch for s in asked} == {1, 2, 4}
    assert without[0] is not None and (found, at, made) == without
    assert {(s.micro_batch, s.empty_cache) for s in screened} == {
        (m, p) for m in (1, 2) for p in ("never", "every-step")
    }
    assert found is not None and found.strategy == variants[0] and (at, made) == (1.5, 4)


def test_a_step_key_tells_apart_exactly_the_variants_that_differ_beyond_empty_cache_and_allocator() -> None:
    """Over the variants of two points (and the same with EMA on), two variants share a key exactly when they are
    equal once both are without ``empty_cache`` calls on the default allocator."""
    workload, hardware = grpo_opt125m()
    points = list(rlhf_outer_points(workload, hardware, generations=searched_generations(workload, hardware)))
    engine = next(p for p in points if p.rollout is not None)
    other = next(p for p in points if p.rollout is None)
    variants: list[RLHFStrategy] = []
    for p in (engine, other):
        s = RLHFStrategy(p.actor, p.critic, p.reference, p.reward, p.hybrid_engine, rollout=p.rollout)
        for ema in (False, True):
            variants += rlhf_variants(workload, hardware, replace(s, ema=ema))[::7]
    plain = [replace(v, empty_cache="never", allocator="default") for v in variants]
    keys = [_step_key(v) for v in variants]
    pairs = [(i, j) for i in range(len(variants)) for j in range(i + 1, len(variants))]
    assert all((keys[i] == keys[j]) == (plain[i] == plain[j]) for i, j in pairs)
    assert any(keys[i] == keys[j] and variants[i] != variants[j] for i, j in pairs)  # a step's variants share it


def test_the_variants_keep_every_field_of_the_strategy_but_the_inner_ones() -> None:
    """A strategy with EMA, a LoRA actor and its reward's own block: every variant holds each of them, and its
    inner fields range over the point's choices."""
    workload, hardware = grpo_opt125m()
    points = list(rlhf_outer_points(workload, hardware, generations=searched_generations(workload, hardware)))
    p = next(p for p in points if p.rollout is None)
    s = RLHFStrategy(replace(p.actor, lora_rank=8), p.critic, p.reference, p.reward, p.hybrid_engine, ema=True)
    kept = [f.name for f in fields(RLHFStrategy) if f.name not in INNER]
    assert kept  # the fields the variants keep
    variants = rlhf_variants(workload, hardware, s)
    assert all(getattr(v, name) == getattr(s, name) for v in variants for name in kept)
    assert isinstance(variants[0].actor, TrainedModelStrategy) and variants[0].actor.lora_rank == 8
    assert len({(v.micro_batch, v.empty_cache) for v in variants}) > 1


def test_a_candidates_walk_bound_is_the_one_the_bound_walk_gives_its_point() -> None:
    """``rlhf_point_least`` of each DeepSpeed-generation point, asked one candidate at a time as the confirmation
    asks (the blocks' pieces cached by value across the calls), is the bound of that point among all of them."""
    workload, hardware = grpo_opt125m()
    points = [
        p
        for p in rlhf_outer_points(workload, hardware, generations=searched_generations(workload, hardware))
        if p.rollout is None
    ][:60]
    together = point_bounds(workload, hardware, C, points)
    for p, bound in zip(points, together, strict=True):
        strategy = RLHFStrategy(p.actor, p.critic, p.reference, p.reward, p.hybrid_engine)
        assert rlhf_point_least(workload, hardware, C, Candidate(strategy, fake_prediction(1.0, 1.0))) == bound


def test_a_point_not_needed_replays_no_variant_whose_floor_overflows_its_known_budget() -> None:
    """A fits at 1.6 s by the replay, enough for the answer; point B's choice screens fitting at 1.55 s, and its floor
    (10.5 GiB) is below the bound of every strategy's usable bytes (11 GiB with a 10% spread) but above B's own
    (10 GiB, its layout's). Without ``point_budget`` B's choice is replayed (it overflows); with it, it is not,
    and the plans that fit are the same."""
    a = Strategy(zero_stage=1)
    b = Strategy(zero_stage=2)
    spread = replace(fake_prediction(1.55, 9.0), reserved_uncertainty=0.1)
    screened = {a: fake_prediction(1.5, 9.0), b: spread}
    replayed = {a: fake_prediction(1.6, 9.5), b: fake_prediction(1.8, 10.6)}
    result = SearchResult(ranked=(Candidate(a, screened[a]), Candidate(b, screened[b])), trials=2, sampler="grid")
    made: list[Strategy] = []

    def replay(s: Strategy | RLHFStrategy) -> Prediction:
        assert isinstance(s, Strategy)
        made.append(s)
        return replayed[s]

    def floor(s: Strategy | RLHFStrategy) -> int:
        return int(10.5 * GiB) if s == b else 9 * GiB

    def variants(s: Strategy | RLHFStrategy) -> list[Strategy | RLHFStrategy]:
        return [s]

    def screen(s: Strategy | RLHFStrategy) -> Prediction:
        assert isinstance(s, Strategy)
        return screened[s]

    old = confirm(result, 1, variants, screen, replay, floor)
    assert made == [a, b] and old.replays == 2  # the case means something: B was replayed
    made.clear()
    new = confirm(result, 1, variants, screen, replay, floor, point_budget=lambda c: 10 * GiB)
    assert made == [a] and new.replays == 1
    assert [c.strategy for c in new.ranked if c.prediction.fits] == [
        c.strategy for c in old.ranked if c.prediction.fits
    ]


def test_a_points_budget_is_the_one_its_variants_replay_against() -> None:
    """``replay_budget`` of a candidate (from its screened prediction, before any replay) is the usable bytes the
    replay of each of its point's variants holds, for a DeepSpeed-generation point and an engine point."""
    workload, hardware = grpo_opt125m()
    points = list(rlhf_outer_points(workload, hardware, generations=searched_generations(workload, hardware)))
    for p in (next(p for p in points if p.rollout is None), next(p for p in points if p.rollout is not None)):
        strategy = RLHFStrategy(p.actor, p.critic, p.reference, p.reward, p.hybrid_engine, rollout=p.rollout)
        variants = rlhf_variants(workload, hardware, strategy)
        candidate = Candidate(variants[0], screen_rlhf(workload, variants[0], hardware, C))
        budget = replay_budget(workload, hardware, C, candidate)
        for v in variants[::97][:2]:
            assert predict_rlhf(workload, v, hardware, C).gpu_budget_bytes == budget


def test_the_screens_floor_is_held_against_a_known_budget_before_the_streams_floor_is_built() -> None:
    """A variant whose screened peak allocated (10.6 GiB, less the 2% slack: 10.39 GiB) exceeds its point's known
    budget (10 GiB) cannot fit, though within every strategy's bound (11 GiB with a 10% spread): its stream's floor
    (a stream built) is not asked. Below the budget, the stream's floor still decides."""
    asked: list[Strategy | RLHFStrategy] = []

    def floor(s: Strategy | RLHFStrategy) -> int:
        asked.append(s)
        return 9 * GiB

    over = replace(fake_prediction(1.0, 9.0, allocated_gib=10.6), reserved_uncertainty=0.1)
    under = replace(fake_prediction(1.0, 9.0, allocated_gib=9.5), reserved_uncertainty=0.1)
    assert cannot_fit(Strategy(), over, floor, 10 * GiB) and not asked
    assert not cannot_fit(Strategy(), over, floor) and len(asked) == 1  # without the budget: every strategy's
    assert not cannot_fit(Strategy(), under, floor, 10 * GiB) and len(asked) == 2
